"""PLE on the public API (``model.kind: ple``, or ``model: {factory: "cosparse.models.ple:build",
args: {tasks, levels, experts, specific, expert, tower, dropout}}``): progressive layered
extraction, ``levels`` CGC layers of shared and task-specific experts over the dense inputs and
every feature's pooled embedding, then a tower per task (``cosparse.nn.multitask``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cosparse.config import TableConfig
from cosparse.models import pooled
from cosparse.nn.model_batch import Batch
from cosparse.nn.multitask import PLE as PLELayers
from cosparse.nn.multitask import TaskTowers


class PLE(pooled.PooledModel):
    """Progressive layered extraction (Tang et al., RecSys 2020) with one tower per task."""

    def __init__(self, tables: Sequence[TableConfig], num_dense: int, tasks: list[str],
                 levels: int, experts: int, specific: int, expert: list[int], tower: list[int],
                 dropout: float = 0.0) -> None:
        super().__init__(tables, "cosparse.models.ple")
        drop = pooled.tower_dropout(dropout)
        self.ple = PLELayers(self.input_width(num_dense), tasks, levels, experts, specific,
                             expert, drop)
        self.towers = TaskTowers(expert[-1], tasks, tower, drop)

    def forward(self, batch: Batch) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return self.towers(self.ple(self.inputs(batch)))


def build(tables: Sequence[TableConfig], num_dense: int, tasks: Sequence[str] = ("label",),
          levels: int = 2, experts: int = 4, specific: int = 1,
          expert: Sequence[int] = (64, 32), tower: Sequence[int] = (32,),
          dropout: float = 0.0) -> PLE:
    """The factory: ``tasks`` (the objective's task names; ``model.kind: ple`` passes them),
    ``levels`` (CGC layers), ``experts`` (shared experts per layer), ``specific`` (each task's
    own experts per layer), ``expert`` (an expert's layer widths), ``tower`` (each task
    tower's hidden widths) and ``dropout``."""
    return PLE(tables, num_dense, pooled.task_names(tasks), pooled.count("levels", levels, 1),
               pooled.count("experts", experts, 0), pooled.count("specific", specific, 1),
               pooled.layer_sizes("expert", expert), pooled.hidden_sizes("tower", tower), dropout)
