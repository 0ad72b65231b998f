"""DCN-v2 on the public API: ``model: {factory: "cosparse.models.dcn:build", args:
{cross_layers, cross_rank, deep, dropout}}`` trains the numbers of ``model.kind: dcn`` bit for
bit (the same head, ``cosparse.nn.heads.CrossHead``)."""

from __future__ import annotations

from collections.abc import Sequence

from cosparse.config import ConfigError, TableConfig
from cosparse.models.pooled import PooledModel, layer_sizes, tower_dropout
from cosparse.nn.heads import CrossHead


class DCNv2(CrossHead, PooledModel):
    """A stack of cross layers (full or low-rank) then a deep tower, over the dense inputs and
    every feature's pooled embedding, concatenated."""

    def __init__(self, tables: Sequence[TableConfig], num_dense: int, cross_layers: int,
                 cross_rank: int | None, deep: list[int], dropout: float = 0.0) -> None:
        super().__init__(tables, "cosparse.models.dcn")
        width = num_dense + sum(self.embeddings.dim_of(f) for f in self.features)
        self.build_head(width, cross_layers, cross_rank, deep, tower_dropout(dropout))


def build(tables: Sequence[TableConfig], num_dense: int, cross_layers: int = 2,
          cross_rank: int | None = None, deep: Sequence[int] = (64, 32),
          dropout: float = 0.0) -> DCNv2:
    """The factory: ``model.args`` are ``cross_layers``, ``cross_rank`` (None: full matrices),
    ``deep`` and ``dropout``, as the built-in model's ``model.*`` keys of those names."""
    if isinstance(cross_layers, bool) or not isinstance(cross_layers, int) or cross_layers < 0:
        raise ConfigError(f"model.args.cross_layers: a count of cross layers (0 or more), got "
                          f"{cross_layers!r}")
    if cross_rank is not None:
        cross_rank = layer_sizes("cross_rank", [cross_rank])[0]
    return DCNv2(tables, num_dense, cross_layers, cross_rank, layer_sizes("deep", deep), dropout)
