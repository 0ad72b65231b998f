"""MMoE on the public API (``model.kind: mmoe``, or ``model: {factory:
"cosparse.models.mmoe:build", args: {tasks, experts, expert, tower, dropout}}``): shared expert
MLPs over the dense inputs and every feature's pooled embedding, a softmax gate and a tower per
task (``cosparse.nn.multitask``); ``forward`` gives each task's output, keyed by task name."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cosparse.config import TableConfig
from cosparse.models.pooled import (
    PooledModel,
    count,
    hidden_sizes,
    layer_sizes,
    task_names,
    tower_dropout,
)
from cosparse.nn.model_batch import Batch
from cosparse.nn.multitask import MMoE as MMoELayer
from cosparse.nn.multitask import TaskTowers


class MMoE(PooledModel):
    """Multi-gate mixture of experts (Ma et al., KDD 2018) with one tower per task."""

    def __init__(self, tables: Sequence[TableConfig], num_dense: int, tasks: list[str],
                 experts: int, expert: list[int], tower: list[int], dropout: float = 0.0) -> None:
        super().__init__(tables, "cosparse.models.mmoe")
        drop = tower_dropout(dropout)
        self.mmoe = MMoELayer(self.input_width(num_dense), tasks, experts, expert, drop)
        self.towers = TaskTowers(expert[-1], tasks, tower, drop)

    def forward(self, batch: Batch) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return self.towers(self.mmoe(self.inputs(batch)))


def build(tables: Sequence[TableConfig], num_dense: int, tasks: Sequence[str] = ("label",),
          experts: int = 4, expert: Sequence[int] = (64, 32), tower: Sequence[int] = (32,),
          dropout: float = 0.0) -> MMoE:
    """The factory: ``tasks`` (the objective's task names; ``model.kind: mmoe`` passes them),
    ``experts`` (how many), ``expert`` (each expert's layer widths), ``tower`` (each task
    tower's hidden widths, before its one output) and ``dropout``."""
    return MMoE(tables, num_dense, task_names(tasks), count("experts", experts, 1),
                layer_sizes("expert", expert), hidden_sizes("tower", tower), dropout)
