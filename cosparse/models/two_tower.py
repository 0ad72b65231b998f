"""Two-tower retrieval on the public API (``model.kind: two_tower``, or ``model: {factory:
"cosparse.models.two_tower:build", args: {task, user, item, tower, logq, dropout}}``): a user
tower over the user's features (by default ``user`` and every pooled history, ``hist_*``) and
an item tower over the item's (``item`` and the item's own columns), each an MLP to an
L2-normalised embedding; trained with the in-batch sampled softmax and logQ correction of
``cosparse.nn.retrieval``; evaluated by ranking the whole item corpus
(``cosparse.train.retrieval_eval``), for which it encodes users and items apart
(``encode_users``, ``encode_items``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from cosparse.config import ConfigError, TableConfig
from cosparse.data.uniform_negatives import is_negative, negatives_of
from cosparse.models.pooled import feature_groups, layer_sizes, tower_dropout
from cosparse.nn.embedding_bags import EmbeddingBagCollection
from cosparse.nn.model_batch import Batch
from cosparse.nn.retrieval import ItemFrequency, Retrieval, retrieval_output
from cosparse.nn.towers import mlp


def default_towers(features: Sequence[str]) -> tuple[list[str], list[str]]:
    """The user tower's features (``user`` and every ``hist_*``) and the item tower's
    (``item`` and every other feature: the item's own columns)."""
    user = [f for f in features if f == "user" or f.startswith("hist_")]
    item = [f for f in features if f not in user and not is_negative(f)]
    return user, item


class TwoTower(nn.Module):
    """User and item towers over one ``EmbeddingBagCollection``; ``forward`` gives the retrieval
    task's ``Retrieval`` (the batch's user and item embeddings and item IDs)."""

    def __init__(self, tables: Sequence[TableConfig], num_dense: int, task: str,
                 user: list[str] | None, item: list[str] | None, tower: list[int],
                 logq: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        self.embeddings = EmbeddingBagCollection(tables)
        known = list(self.embeddings.features)
        default_user, default_item = default_towers(known)
        user = default_user if user is None else user
        item = default_item if item is None else item
        feature_groups(known, {"user": user, "item": item}, "the {key} tower's features")
        for i, t in enumerate(self.embeddings.tables):
            if t.pooling == "none":
                raise ConfigError(f"tables[{i}].pooling: the towers pool every feature; 'none' "
                                  "needs a sequence model")
        self.task, self.user_features, self.item_features = task, list(user), list(item)
        # the item's ID: its IDs tell in-batch duplicates apart and key the logQ correction
        self.id_feature = "item" if "item" in item else item[0]
        drop = tower_dropout(dropout)
        width = {f: self.embeddings.dim_of(f) for f in known}
        self.user_tower = mlp([num_dense + sum(width[f] for f in user), *tower],
                              last_activation=False, dropout=drop)
        self.item_tower = mlp([sum(width[f] for f in item), *tower], last_activation=False,
                              dropout=drop)
        self.frequency = ItemFrequency() if logq else None
        # data.events.uniform_negatives: per negative j, its features for the item tower's
        self.negative_features = negatives_of(known, self.item_features)

    def encode_users(self, batch: Batch) -> torch.Tensor:
        """[B, D] L2-normalised user embeddings."""
        pooled = self.embeddings(batch)
        x = torch.cat([batch.dense, *(pooled[f] for f in self.user_features)], dim=1)
        return F.normalize(self.user_tower(x), dim=1)

    def encode_items(self, batch: Batch, features: list[list[str]] | None = None
                     ) -> torch.Tensor:
        """[B, D] L2-normalised item embeddings; with ``features`` (per item of a sample,
        its features, in the item tower's order) [B * len(features), D], sample-major."""
        pooled = self.embeddings(batch)
        groups = [self.item_features] if features is None else features
        x = torch.stack([torch.cat([pooled[f] for f in g], dim=1) for g in groups], dim=1)
        return F.normalize(self.item_tower(x.flatten(0, 1)), dim=1)

    def forward(self, batch: Batch) -> dict[str, Retrieval]:
        return {self.task: retrieval_output(self, batch, self.item_features)}


def build(tables: Sequence[TableConfig], num_dense: int, task: str = "label",
          user: Sequence[str] | None = None, item: Sequence[str] | None = None,
          tower: Sequence[int] = (64, 32), logq: bool = True, dropout: float = 0.0) -> TwoTower:
    """The factory: ``task`` (the objective's retrieval task), ``user`` and ``item`` (each
    tower's features; None: ``default_towers`` of the tables' features, the item ID first),
    ``tower`` (each tower's layer widths, the last the embedding's), ``logq`` (the logQ
    correction) and ``dropout``."""
    if not isinstance(logq, bool):
        raise ConfigError(f"model.args.logq: true or false, got {logq!r}")
    return TwoTower(tables, num_dense, task, None if user is None else list(user),
                    None if item is None else list(item), layer_sizes("tower", tower), logq,
                    dropout)
