"""DeepFM on the public API: ``model: {factory: "cosparse.models.deepfm:build", args: {deep,
dropout}}`` trains the numbers of ``model.kind: deepfm`` bit for bit (the same head,
``cosparse.nn.heads.FMHead``)."""

from __future__ import annotations

from collections.abc import Sequence

from cosparse.config import ConfigError, TableConfig
from cosparse.models.pooled import PooledModel, layer_sizes, tower_dropout
from cosparse.nn.heads import FMHead


class DeepFM(FMHead, PooledModel):
    """FM second-order term + first-order terms + a deep tower over the pooled embeddings and
    the dense inputs, summed into one logit."""

    def __init__(self, tables: Sequence[TableConfig], num_dense: int, deep: list[int],
                 dropout: float = 0.0) -> None:
        super().__init__(tables, "cosparse.models.deepfm")
        dim = self.embeddings.dim_of(self.features[0])
        self.build_head(num_dense, len(self.features), dim, deep, tower_dropout(dropout))


def build(tables: Sequence[TableConfig], num_dense: int, deep: Sequence[int] = (64, 32),
          dropout: float = 0.0) -> DeepFM:
    """The factory: ``model.args`` are ``deep`` and ``dropout``, as ``model.deep`` /
    ``dropout`` of the built-in model; every table has one dim (the FM term's)."""
    dims = {t.dim for t in tables}
    if len(dims) > 1:
        raise ConfigError(f"tables[*].dim: cosparse.models.deepfm needs one dim, got "
                          f"{sorted(dims)}")
    return DeepFM(tables, num_dense, layer_sizes("deep", deep), dropout)
