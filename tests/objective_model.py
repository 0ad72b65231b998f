"""A user's model of two tasks (a binary one, and a regression weighted per sample and masked
by the first), the CSV it trains on, and its config: for ``tests/test_objective.py`` and the
2-rank script ``tests/objective_ranks.py``."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import cosparse

TASKS = {"ctr": {"kind": "binary", "group_by": "user"},
         "watch": {"kind": "regression", "loss": "huber", "delta": 2.0, "weight": 0.5,
                   "mask": "ctr"}}
TABLES = [{"name": "ids", "dim": 4, "features": ["user", "item"],
           "optimizer": {"kind": "rowwise_adagrad", "lr": 0.05}}]


def write_csv(path, n: int = 200) -> None:
    rng = np.random.default_rng(3)
    user, item = rng.integers(0, 20, n), rng.integers(0, 30, n)
    d1 = rng.normal(size=n).round(3)
    click = (rng.random(n) < 0.4).astype(int)
    watch = (rng.exponential(3.0, n) * click).round(2)
    w = rng.choice([0.5, 1.0, 2.0], n)
    rows = ["user,item,d1,click,watch,w"] + [
        f"{user[i]},{item[i]},{d1[i]},{click[i]},{watch[i]},{w[i]}" for i in range(n)]
    path.write_text("\n".join(rows) + "\n")


def mapping(path, objective: bool = True) -> dict:
    raw = {
        "data": {"reader": "csv", "path": str(path), "batch_size": 32, "workers": 0,
                 "eval_fraction": 0.2,
                 "columns": {"labels": {"ctr": "click", "watch": "watch"}, "weight": "w",
                             "dense": ["d1"]}},
        "model": {"dense_optimizer": {"kind": "adam", "lr": 0.01}},
        "train": {"steps": 4, "log_every": 4, "progress": False, "threads": 1},
        "supply": {"lookahead": 1},
    }
    if objective:
        raw["objective"] = {"tasks": TASKS}
    return raw


class TwoTasks(nn.Module):
    """Pooled IDs and the dense column into a shared layer, one head per task; it also checks
    the Batch carries each task's labels and the weights."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embeddings = cosparse.EmbeddingBagCollection(TABLES)
        self.shared = nn.Linear(2 * 4 + 1, 8)
        self.ctr, self.watch = nn.Linear(8, 1), nn.Linear(8, 1)

    def forward(self, batch: cosparse.Batch) -> dict[str, torch.Tensor]:
        assert sorted(batch.labels) == ["ctr", "watch"] and batch.weights is not None
        e = self.embeddings(batch)
        h = torch.relu(self.shared(torch.cat([e["user"], e["item"], batch.dense], dim=1)))
        return {"ctr": self.ctr(h).squeeze(1), "watch": self.watch(h).squeeze(1)}
