"""A model of two tasks on the Taobao UserBehavior log: ``engage`` (the event is a cart, fav or
buy) and ``buy``, from one sample per event with the user's earlier events as history.

Built from YAML by ``model: {factory: "two_tasks:build", args: {hidden: [64, 32]}}`` with
``--model-path examples`` (``examples/two_tasks.yaml``), or in Python::

    model = build(cosparse.load_config("examples/two_tasks.yaml").tables, 0)

The tables (``two_tasks.yaml``) pool each feature: the target item and category are bags of one,
the history's items, categories and behaviours are averaged. The pooled rows, and the product
of the target item with the history's mean item, go through a shared tower into one logit per
task.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

import cosparse

TASKS = ("engage", "buy")


class TwoTasks(nn.Module):
    """A shared tower over the pooled features, one head per task."""

    def __init__(self, tables: Sequence[Any], hidden: Sequence[int]) -> None:
        super().__init__()
        self.embeddings = cosparse.EmbeddingBagCollection(tables)
        dims = {f: t.dim for t in self.embeddings.tables for f in t.features}
        self.features = list(dims)
        width = sum(dims.values()) + dims["target_item"]
        layers: list[nn.Module] = []
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        self.tower = nn.Sequential(*layers)
        self.heads = nn.ModuleDict({t: nn.Linear(width, 1) for t in TASKS})

    def forward(self, batch: cosparse.Batch) -> dict[str, torch.Tensor]:
        pooled = self.embeddings(batch)  # {feature: Tensor[B, dim]}
        match = pooled["target_item"] * pooled["hist_item"]  # the target against the history
        x = self.tower(torch.cat([*(pooled[f] for f in self.features), match], dim=1))
        return {t: head(x).squeeze(1) for t, head in self.heads.items()}


def build(tables: Sequence[Any], num_dense: int, hidden: Sequence[int] = (64, 32)) -> TwoTasks:
    """The factory (``model.factory: "two_tasks:build"``): the log has no dense inputs."""
    del num_dense  # (taobao_events gives none)
    return TwoTasks(tables, list(hidden))
