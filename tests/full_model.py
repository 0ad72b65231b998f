"""The model of issue 34's "done when", outside ``cosparse/``: two tasks (a binary click and a
per-sample-weighted regression masked by it), a pooled table and a ``pooling: none`` sequence
table through one ``cosparse.EmbeddingBagCollection``, and dense inputs; its CSV (a ``hist``
column of ``|``-separated item IDs), its config, a factory for ``model.factory`` and a
deliberately non-deterministic variant (dropout seeded from the OS)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import cosparse

TASKS = {"ctr": {"kind": "binary", "group_by": "user"},
         "watch": {"kind": "regression", "loss": "huber", "delta": 2.0, "weight": 0.5,
                   "mask": "ctr"}}
TABLES = [{"name": "ids", "dim": 4, "features": ["user", "item"],
           "optimizer": {"kind": "rowwise_adagrad", "lr": 0.05}},
          {"name": "history", "dim": 4, "features": ["hist"], "pooling": "none", "seed": 5,
           "optimizer": {"kind": "adam", "lr": 0.01}}]


def write_csv(path, n: int = 320) -> None:
    """``n`` rows: user, item, a history of 0 to 4 earlier items, two dense columns, the click,
    the watch time (0 without a click) and a sample weight."""
    rng = np.random.default_rng(11)
    user, item = rng.integers(0, 400, n), rng.integers(0, 1000, n)
    hist = ["|".join(map(str, rng.integers(0, 1000, rng.integers(0, 5)))) for _ in range(n)]
    d1, d2 = rng.normal(size=n).round(3), rng.random(n).round(3)
    click = (rng.random(n) < 0.4).astype(int)
    watch = (rng.exponential(3.0, n) * click).round(2)
    w = rng.choice([0.5, 1.0, 2.0], n)
    rows = ["user,item,hist,d1,d2,click,watch,w"] + [
        f"{user[i]},{item[i]},{hist[i]},{d1[i]},{d2[i]},{click[i]},{watch[i]},{w[i]}"
        for i in range(n)]
    path.write_text("\n".join(rows) + "\n")


def mapping(path, steps: int = 4) -> dict:
    return {
        "data": {"reader": "csv", "path": str(path), "batch_size": 32, "workers": 0,
                 "eval_fraction": 0.2,
                 "columns": {"labels": {"ctr": "click", "watch": "watch"}, "weight": "w",
                             "dense": ["d1", "d2"], "sparse": ["user", "item"],
                             "sequence": ["hist"]},
                 "schema": {"hist": "list<int64>"}},
        "objective": {"tasks": TASKS},
        "model": {"dense_optimizer": {"kind": "adam", "lr": 0.01}},
        "train": {"steps": steps, "log_every": steps, "progress": False, "threads": 1},
        "supply": {"lookahead": 1},
    }


class FullModel(nn.Module):
    """The pooled user and item rows, the history's rows averaged per sample, and the dense
    inputs into a shared layer; one head per task."""

    def __init__(self, tables: Sequence = TABLES, num_dense: int = 2) -> None:
        super().__init__()
        self.lookup = cosparse.EmbeddingBagCollection(tables)
        self.shared = nn.Linear(3 * 4 + num_dense, 8)
        self.ctr, self.watch = nn.Linear(8, 1), nn.Linear(8, 1)

    def forward(self, batch: cosparse.Batch) -> dict[str, torch.Tensor]:
        e = self.lookup(batch)
        history = e["hist"]
        rows = torch.arange(history.values.shape[0], device=history.values.device)
        mean_history = F.embedding_bag(rows, history.values, history.offsets, mode="mean",
                                       include_last_offset=True)
        h = torch.relu(self.shared(torch.cat([e["user"], e["item"], mean_history, batch.dense],
                                             dim=1)))
        return {"ctr": self.ctr(h).squeeze(1), "watch": self.watch(h).squeeze(1)}


def build(tables: Sequence, num_dense: int) -> FullModel:
    """The factory ``model: {factory: "full_model:build"}``."""
    return FullModel(tables, num_dense)


def new_model(seed: int = 0) -> FullModel:
    torch.manual_seed(seed)
    return FullModel()


class EntropyDropout(FullModel):
    """Dropout on the click logits with masks from a generator seeded by the OS."""

    def __init__(self) -> None:
        super().__init__()
        self.masks = torch.Generator()
        self.masks.seed()  # (a non-deterministic seed, not the step's)

    def forward(self, batch):
        out = super().forward(batch)
        keep = torch.rand(out["ctr"].shape, generator=self.masks) >= 0.3
        return {**out, "ctr": out["ctr"] * keep / 0.7}
