"""BST (Behavior Sequence Transformer, Chen et al., DLP-KDD 2019) on the public API: a ranking
model that uses the behaviour sequence as a feature through target attention. ``model: {factory:
"cosparse.models.bst:build", args: {pairs, max_len, layers, heads, inner, mlp, dropout}}``.

The target (the sum of the rows of each pair's target feature, ``target_item`` + ``target_cate``,
say) and its history (the sum of each pair's history feature, event by event, from unpooled
tables) go through ``cosparse.nn.sequence.TargetTransformer``; its output at the target, the
targets, every other feature (sum-pooled when unpooled) and the dense inputs feed an MLP to one
logit. Trained with the objective's binary task as any ranking model is.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from cosparse.config import ConfigError, TableConfig
from cosparse.models.pooled import layer_sizes, tower_dropout
from cosparse.nn.din import pool
from cosparse.nn.embedding_bags import EmbeddingBagCollection
from cosparse.nn.model_batch import Batch
from cosparse.nn.sequence import TargetTransformer
from cosparse.nn.towers import mlp
from cosparse.nn.types import Jagged


class BST(nn.Module):
    """Target attention over the behaviour sequence, then an MLP over everything."""

    def __init__(self, tables: Sequence[TableConfig], num_dense: int,
                 pairs: list[list[str]], max_len: int, layers: int, heads: int, inner: int,
                 hidden: list[int], dropout: float = 0.0) -> None:
        super().__init__()
        self.embeddings = EmbeddingBagCollection(tables)
        table_of = {f: (i, t) for i, t in enumerate(self.embeddings.tables) for f in t.features}
        if not pairs:
            raise ConfigError("model.args.pairs: BST needs at least one [target, history] pair")
        for j, pair in enumerate(pairs):
            if len(pair) != 2 or any(f not in table_of for f in pair):
                raise ConfigError(f"model.args.pairs[{j}]: [target feature, history feature] "
                                  f"of the tables' ({list(table_of)}); got {pair}")
            i, t = table_of[pair[1]]
            if t.pooling != "none":
                raise ConfigError(f"tables[{i}].pooling: BST reads the history '{pair[1]}' "
                                  "unpooled; set pooling: none")
        dims = {f: table_of[f][1].dim for p in pairs for f in p}
        if len(set(dims.values())) != 1:
            raise ConfigError(f"tables[*].dim: BST sums the pairs' rows, so they need one dim; "
                              f"got {dims}")
        dim = next(iter(dims.values()))
        if dim % heads:
            raise ConfigError(f"model.args.heads: {heads} heads do not divide the rows' dim {dim}")
        self.targets = [p[0] for p in pairs]
        self.histories = [p[1] for p in pairs]
        used = set(self.targets) | set(self.histories)
        self.others = [f for f in table_of if f not in used]
        drop = tower_dropout(dropout)
        self.attention = TargetTransformer(dim, max_len, layers, heads, inner, drop)
        width = num_dense + sum(table_of[f][1].dim for f in self.others) + 2 * dim
        self.mlp = mlp([width, *hidden, 1], last_activation=False, dropout=drop)

    def forward(self, batch: Batch) -> torch.Tensor:
        rows = self.embeddings(batch)
        target = torch.stack([pool(rows[f]) for f in self.targets]).sum(0)
        hist = [rows[f] for f in self.histories]
        first = hist[0]
        if not all(isinstance(h, Jagged) for h in hist):
            raise ValueError("BST: a history came pooled; its tables need pooling: none")
        values = torch.stack([h.values for h in hist]).sum(0)  # type: ignore[union-attr]
        attended = self.attention(target, Jagged(values, first.lengths, first.offsets))  # type: ignore[union-attr]
        x = torch.cat([batch.dense, *(pool(rows[f]) for f in self.others), target, attended],
                      dim=1)
        return self.mlp(x).squeeze(-1)


def build(tables: Sequence[TableConfig], num_dense: int,
          pairs: Sequence[Sequence[str]] = (("target_item", "hist_item"),), max_len: int = 100,
          layers: int = 1, heads: int = 2, inner: int = 64, mlp: Sequence[int] = (128, 64),
          dropout: float = 0.0) -> BST:
    """The factory: ``pairs`` ([target feature, history feature] each; their rows are summed),
    ``max_len`` (the longest history, ``data.events.max_len``), the attention's ``layers``,
    ``heads`` and feed-forward width ``inner``, the output MLP's hidden widths ``mlp`` and
    ``dropout``."""
    for key, value in (("max_len", max_len), ("layers", layers), ("heads", heads),
                       ("inner", inner)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"model.args.{key}: an integer >= 1, got {value!r}")
    return BST(tables, num_dense, [list(p) for p in pairs], max_len, layers, heads, inner,
               layer_sizes("mlp", mlp), dropout)
