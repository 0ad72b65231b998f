"""A model of a user's own, outside ``cosparse/``, for the public API's tests: a pooled table and
a ``pooling: none`` sequence table through ``cosparse.EmbeddingBagCollection``, the dense inputs
through a ``LazyLinear``, one logit per sample."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import cosparse

STEPS = 10


def mapping(**sections: dict) -> dict:
    """A small config for the model (synthetic data: 3 dense columns, 4 ID features of bags of
    1 to 3); ``sections`` replace whole sections."""
    raw = {
        "data": {"reader": "synthetic", "batch_size": 64, "workers": 0,
                 "synthetic": {"num_features": 4, "num_dense": 3, "vocab_size": 3000,
                               "alpha": 1.05, "bag_min": 1, "bag_max": 3, "seed": 7,
                               "num_batches": STEPS + 2, "eval_batches": 1}},
        "model": {"dense_optimizer": {"kind": "adam", "lr": 0.01}},
        "train": {"steps": STEPS, "log_every": STEPS, "progress": False, "threads": 1},
        "supply": {"lookahead": 1},
    }
    raw.update(sections)
    return raw


TABLES = [
    {"name": "items", "dim": 8, "features": ["C1", "C2", "C3"],
     "optimizer": {"kind": "rowwise_adagrad", "lr": 0.05}},
    {"name": "history", "dim": 4, "features": ["C4"], "pooling": "none", "seed": 3,
     "optimizer": {"kind": "adam", "lr": 0.01}},
]


class UserModel(nn.Module):
    """Pooled item embeddings, the history's rows averaged per sample, and the dense inputs
    through a lazy layer, into an MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.embeddings = cosparse.EmbeddingBagCollection(TABLES)
        self.dense_in = nn.LazyLinear(8)
        self.top = nn.Sequential(nn.Linear(3 * 8 + 4 + 8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, batch: cosparse.Batch) -> torch.Tensor:
        looked_up = self.embeddings(batch)
        assert list(looked_up) == ["C1", "C2", "C3", "C4"]  # the tables' feature order
        history = looked_up["C4"]
        assert isinstance(history, cosparse.Jagged)
        rows = torch.arange(history.values.shape[0], device=history.values.device)
        mean_history = F.embedding_bag(rows, history.values, history.offsets, mode="mean",
                                       include_last_offset=True)
        x = torch.cat([looked_up["C1"], looked_up["C2"], looked_up["C3"], mean_history,
                       torch.relu(self.dense_in(batch.dense))], dim=1)
        return self.top(x).squeeze(1)


def new_model(seed: int = 0, kind: type[UserModel] | None = None) -> UserModel:
    torch.manual_seed(seed)
    return (kind or UserModel)()


class TwoCollections(UserModel):
    """The same model with its tables in two collections, one of them nested (as a two-tower
    model holds one per tower): the same layers from the same seed, so the same numbers."""

    def __init__(self) -> None:
        super().__init__()
        del self.embeddings
        self.items = cosparse.EmbeddingBagCollection(TABLES[:1])
        self.towers = nn.ModuleList([cosparse.EmbeddingBagCollection(TABLES[1:])])
        self.embeddings = _Joined(self.items, self.towers[0])


class _Joined:
    """Both collections' lookups as one dict (not a module: the collections are found where
    they sit)."""

    def __init__(self, *collections: cosparse.EmbeddingBagCollection) -> None:
        self.collections = collections

    def __call__(self, batch: cosparse.Batch) -> dict:
        return {f: v for c in self.collections for f, v in c(batch).items()}
