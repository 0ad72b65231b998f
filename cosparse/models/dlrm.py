"""DLRM on the public API: ``model: {factory: "cosparse.models.dlrm:build", args: {bottom,
top}}`` trains the numbers of ``model.kind: dlrm`` bit for bit (the same layers, built in the
same order from the same seed, the same operations in the same order)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from cosparse.api.batch import Batch
from cosparse.api.embedding_bags import EmbeddingBagCollection
from cosparse.config import ConfigError, TableConfig
from cosparse.nn.towers import mlp


class DLRM(nn.Module):
    """Bottom MLP on the dense inputs, pairwise dot interaction with every feature's pooled
    embedding, top MLP to one logit."""

    def __init__(self, tables: Sequence[TableConfig], num_dense: int, bottom: Sequence[int],
                 top: Sequence[int]) -> None:
        super().__init__()
        self.embeddings = EmbeddingBagCollection(tables)
        self.features = list(self.embeddings.features)
        if not num_dense:
            raise ConfigError("model.args: cosparse.models.dlrm needs dense inputs (the built-in "
                              "model.kind: dlrm learns a constant without them)")
        self.bottom = mlp([num_dense, *bottom], last_activation=True, dropout=None)
        n = len(self.features) + 1
        self.register_buffer("_tri", torch.triu_indices(n, n, offset=1), persistent=False)
        self.top = mlp([bottom[-1] + n * (n - 1) // 2, *top], last_activation=False,
                       dropout=None)

    def forward(self, batch: Batch) -> torch.Tensor:
        pooled = self.embeddings(batch)
        x = self.bottom(batch.dense)
        t = torch.stack([x, *(pooled[f] for f in self.features)], dim=1)  # [B, F+1, D]
        z = torch.bmm(t, t.transpose(1, 2))
        pairs = z[:, self._tri[0], self._tri[1]]
        return self.top(torch.cat([x, pairs], dim=1)).squeeze(-1)


def build(tables: Sequence[TableConfig], num_dense: int, bottom: Sequence[int] = (64, 16),
          top: Sequence[int] = (64, 1)) -> DLRM:
    """The factory: ``model.args`` are ``bottom`` and ``top``, as ``model.bottom`` / ``top``."""
    dims = {t.dim for t in tables}
    if not bottom or not top or dims != {bottom[-1]} or top[-1] != 1:
        raise ConfigError(f"model.args: DLRM needs bottom ending in every table's dim "
                          f"({sorted(dims)}) and top ending in 1 logit; got bottom {list(bottom)}, "
                          f"top {list(top)}")
    return DLRM(tables, num_dense, list(bottom), list(top))
