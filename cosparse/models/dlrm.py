"""DLRM on the public API: ``model: {factory: "cosparse.models.dlrm:build", args: {bottom,
top, dropout}}`` trains the numbers of ``model.kind: dlrm`` bit for bit (the same head,
``cosparse.nn.heads.DotHead``: the same layers, built in the same order from the same seed, the
same operations in the same order)."""

from __future__ import annotations

from collections.abc import Sequence

from cosparse.config import ConfigError, TableConfig
from cosparse.models.pooled import PooledModel, layer_sizes, tower_dropout
from cosparse.nn.heads import DotHead


class DLRM(DotHead, PooledModel):
    """Bottom MLP on the dense inputs (a learned vector without any), pairwise dot interaction
    with every feature's pooled embedding, top MLP to one logit."""

    def __init__(self, tables: Sequence[TableConfig], num_dense: int, bottom: list[int],
                 top: list[int], dropout: float = 0.0) -> None:
        super().__init__(tables, "cosparse.models.dlrm")
        self.build_head(num_dense, len(self.features), bottom, top, tower_dropout(dropout))


def build(tables: Sequence[TableConfig], num_dense: int, bottom: Sequence[int] = (64, 16),
          top: Sequence[int] = (64, 1), dropout: float = 0.0) -> DLRM:
    """The factory: ``model.args`` are ``bottom``, ``top`` and ``dropout``, as ``model.bottom``
    / ``top`` / ``dropout`` of the built-in model."""
    bottom, top = layer_sizes("bottom", bottom), layer_sizes("top", top)
    dims = {t.dim for t in tables}
    if dims != {bottom[-1]} or top[-1] != 1:
        raise ConfigError(f"model.args: DLRM needs bottom ending in every table's dim "
                          f"({sorted(dims)}) and top ending in 1 logit; got bottom {bottom}, "
                          f"top {top}")
    return DLRM(tables, num_dense, bottom, top, dropout)
