"""SASRec on the public API (``model.kind: sasrec``, or ``model: {factory:
"cosparse.models.sasrec:build", args: {task, max_len, layers, heads, inner, history, item, logq,
dropout}}``): a causal transformer over the behaviour history (``cosparse.nn.sequence``) whose
output at the last event is the user's embedding, and the target item's embedding from the same
tables (an item's row is its input and its output embedding, as in SASRec); trained for the
next item with the retrieval task's sampled softmax (in-batch negatives, logQ correction), and
evaluated by ranking the whole item corpus (``encode_users``, ``encode_items``).

Each history event's input is the sum of its history features' rows (``hist_item`` and, say,
``hist_cate``); each item's embedding the sum of its own features' rows (``item`` and its
columns), so every feature it reads has one dim. The history comes unpooled (``pooling: none``:
``model.kind: sasrec`` sets it on every table; a factory-built model asks for it), so the rows
of a long history live in whatever tier the placement gives them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from cosparse.config import ConfigError, TableConfig
from cosparse.data.uniform_negatives import is_negative, negatives_of
from cosparse.models.pooled import feature_groups, tower_dropout
from cosparse.nn.din import pool
from cosparse.nn.embedding_bags import EmbeddingBagCollection
from cosparse.nn.model_batch import Batch
from cosparse.nn.retrieval import ItemFrequency, Retrieval, retrieval_output
from cosparse.nn.sequence import CausalEncoder
from cosparse.nn.types import Jagged

ITEM_IDS = ("item", "target_item")  # the item's ID feature, as the readers name it


def default_sequence(features: Sequence[str]) -> tuple[list[str], list[str]]:
    """The history's features (every ``hist_*``) and the item's (every other but ``user``)."""
    history = [f for f in features if f.startswith("hist_")]
    return history, [f for f in features if f != "user" and f not in history
                     and not is_negative(f)]


def _summed(values: list[Jagged]) -> Jagged:
    out = values[0]
    for v in values[1:]:
        out = Jagged(out.values + v.values, out.lengths, out.offsets)
    return out


class SASRec(nn.Module):
    """The history through a ``CausalEncoder``; ``forward`` gives the retrieval task's
    ``Retrieval`` (each sample's sequence output, its target item's embedding and ID)."""

    def __init__(self, tables: Sequence[TableConfig], task: str, max_len: int, layers: int,
                 heads: int, inner: int, history: list[str] | None, item: list[str] | None,
                 logq: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        self.embeddings = EmbeddingBagCollection(tables)
        known = list(self.embeddings.features)
        default_history, default_item = default_sequence(known)
        history = default_history if history is None else history
        item = default_item if item is None else item
        feature_groups(known, {"history": history, "item": item}, "the {key}'s features")
        table_of = {f: (i, t) for i, t in enumerate(self.embeddings.tables) for f in t.features}
        for f in history:
            i, t = table_of[f]
            if t.pooling != "none":
                raise ConfigError(f"tables[{i}].pooling: SASRec reads the history '{f}' "
                                  "unpooled; set pooling: none (model.kind: sasrec sets it)")
        dims = {f: table_of[f][1].dim for f in (*history, *item)}
        if len(set(dims.values())) != 1:
            raise ConfigError(f"tables[*].dim: SASRec sums the rows of its features, so they "
                              f"need one dim; got {dims}")
        dim = next(iter(dims.values()))
        if dim % heads:
            raise ConfigError(f"model.sasrec.heads: {heads} heads do not divide the rows' dim "
                              f"{dim}")
        self.task, self.history, self.item = task, list(history), list(item)
        self.id_feature = next((f for f in ITEM_IDS if f in item), item[0])
        self.encoder = CausalEncoder(dim, max_len, layers, heads, inner, tower_dropout(dropout))
        self.frequency = ItemFrequency() if logq else None
        # data.events.uniform_negatives: per negative j, its features for the item's
        self.negative_features = negatives_of(known, self.item)

    def encode_users(self, batch: Batch) -> torch.Tensor:
        """[B, D]: each sample's encoder output at its most recent event."""
        rows = self.embeddings(batch)
        hist = [rows[f] for f in self.history]
        if not all(isinstance(h, Jagged) for h in hist):
            raise ValueError("SASRec: the history came pooled; its tables need pooling: none")
        return self.encoder(_summed(hist))  # type: ignore[arg-type]

    def encode_items(self, batch: Batch, features: list[list[str]] | None = None
                     ) -> torch.Tensor:
        """[B, D]: each sample's item, the sum of its features' rows; with ``features`` (per
        item of a sample, its features) [B * len(features), D], sample-major."""
        rows = self.embeddings(batch)
        groups = [self.item] if features is None else features
        items = [torch.stack([pool(rows[f]) for f in g]).sum(0) for g in groups]
        return items[0] if features is None else torch.stack(items, dim=1).flatten(0, 1)

    def forward(self, batch: Batch) -> dict[str, Retrieval]:
        return {self.task: retrieval_output(self, batch, self.item)}


def build(tables: Sequence[TableConfig], num_dense: int, task: str = "label", max_len: int = 50,
          layers: int = 2, heads: int = 2, inner: int = 256,
          history: Sequence[str] | None = None, item: Sequence[str] | None = None,
          logq: bool = True, dropout: float = 0.0) -> SASRec:
    """The factory: ``task`` (the objective's retrieval task), ``max_len`` (the longest history,
    ``data.events.max_len``), ``layers``, ``heads`` and ``inner`` (the feed-forward's width) of
    the encoder, ``history`` and ``item`` (None: ``default_sequence`` of the tables' features),
    ``logq`` (the logQ correction) and ``dropout``. The dense inputs (``num_dense``) are not
    read."""
    for key, value, least in (("max_len", max_len, 1), ("layers", layers, 1),
                              ("heads", heads, 1), ("inner", inner, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(f"model.args.{key}: an integer >= {least}, got {value!r}")
    if not isinstance(logq, bool):
        raise ConfigError(f"model.args.logq: true or false, got {logq!r}")
    return SASRec(tables, task, max_len, layers, heads, inner,
                  None if history is None else list(history), None if item is None else list(item),
                  logq, dropout)
