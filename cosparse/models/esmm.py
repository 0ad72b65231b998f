"""ESMM on the public API (``model.kind: esmm``, or ``model: {factory:
"cosparse.models.esmm:build", args: {tasks, tower, dropout}}``): the entire space multi-task
model (Ma et al., SIGIR 2018). A CTR tower and a CVR tower share the embeddings; the model is
trained on every impression with two binary tasks, CTR (``tasks[0]``, e.g. a click) and CTCVR
(``tasks[1]``, e.g. a buy, which implies the click), whose probability is
``sigmoid(ctr) * sigmoid(cvr)``. The CVR is never trained on the clicked samples alone, which
removes the sample-selection bias; ``cvr`` gives its probability for any batch."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cosparse.config import ConfigError, TableConfig
from cosparse.models.pooled import PooledModel, hidden_sizes, task_names, tower_dropout
from cosparse.nn.model_batch import Batch
from cosparse.nn.multitask import ctcvr_logit
from cosparse.nn.towers import mlp


class ESMM(PooledModel):
    """CTR and CVR towers over the dense inputs and every feature's pooled embedding; the
    outputs are the CTR logit and the CTCVR logit, keyed by the two task names."""

    def __init__(self, tables: Sequence[TableConfig], num_dense: int, tasks: list[str],
                 tower: list[int], dropout: float = 0.0) -> None:
        super().__init__(tables, "cosparse.models.esmm")
        drop = tower_dropout(dropout)
        width = self.input_width(num_dense)
        self.ctr_task, self.ctcvr_task = tasks
        self.ctr_tower = mlp([width, *tower, 1], last_activation=False, dropout=drop)
        self.cvr_tower = mlp([width, *tower, 1], last_activation=False, dropout=drop)

    def forward(self, batch: Batch) -> dict[str, torch.Tensor]:  # type: ignore[override]
        x = self.inputs(batch)
        ctr, cvr = self.ctr_tower(x).squeeze(-1), self.cvr_tower(x).squeeze(-1)
        return {self.ctr_task: ctr, self.ctcvr_task: ctcvr_logit(ctr, cvr)}

    def cvr(self, batch: Batch) -> torch.Tensor:
        """The conversion probability given a click, [B]."""
        return torch.sigmoid(self.cvr_tower(self.inputs(batch)).squeeze(-1))


def build(tables: Sequence[TableConfig], num_dense: int, tasks: Sequence[str] = ("ctr", "ctcvr"),
          tower: Sequence[int] = (32,), dropout: float = 0.0) -> ESMM:
    """The factory: ``tasks``, the CTR task's name then the CTCVR task's (``model.kind: esmm``
    passes ``model.esmm`` or the objective's two tasks in order), ``tower`` (each tower's
    hidden widths) and ``dropout``."""
    names = task_names(tasks)
    if len(names) != 2:
        raise ConfigError(f"model.args.tasks: ESMM trains two binary tasks, CTR then CTCVR "
                          f"(e.g. [click, buy]), got {names}")
    return ESMM(tables, num_dense, names, hidden_sizes("tower", tower),
                dropout)
