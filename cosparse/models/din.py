"""DIN on the public API: ``model: {factory: "cosparse.models.din:build", args: {pairs,
attention, mlp, normalize, dropout}}`` trains the numbers of ``model.kind: din`` bit for bit
(the same head, ``cosparse.nn.din.DINHead``). Each pair's history comes from a table of
``pooling: none``, whose lookup the ``EmbeddingBagCollection`` gives as ``cosparse.Jagged``
values; every other unpooled feature is sum-pooled."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cosparse.config import ConfigError, DINConfig, TableConfig
from cosparse.models.pooled import layer_sizes, tower_dropout
from cosparse.nn.din import DINHead
from cosparse.nn.embedding_bags import EmbeddingBagCollection
from cosparse.nn.model_batch import Batch


class DIN(DINHead):
    """Target attention of each sample's targets over its behaviour sequence, then an MLP over
    the attended history, the targets, every other feature and the dense inputs."""

    def __init__(self, tables: Sequence[TableConfig], num_dense: int, cfg: DINConfig,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.embeddings = EmbeddingBagCollection(tables)
        self.features = list(self.embeddings.features)
        self.build_head(self.embeddings.tables, num_dense, cfg, tower_dropout(dropout),
                        key="model.args")

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.din_logits(self.embeddings(batch), batch.dense)


def build(tables: Sequence[TableConfig], num_dense: int, pairs: Sequence[Sequence[str]] = (),
          attention: Sequence[int] = (64, 32), mlp: Sequence[int] = (128, 64),
          normalize: str = "none", dropout: float = 0.0) -> DIN:
    """The factory: ``model.args`` are ``pairs`` ([target feature, history feature] each),
    ``attention``, ``mlp``, ``normalize`` (``none`` or ``softmax``) and ``dropout``, as the
    built-in model's ``model.din.*`` and ``model.dropout``."""
    if normalize not in ("none", "softmax"):
        raise ConfigError(f"model.args.normalize: 'none' or 'softmax', got {normalize!r}")
    cfg = DINConfig(pairs=[list(p) for p in pairs], attention=layer_sizes("attention", attention),
                    mlp=layer_sizes("mlp", mlp), normalize=normalize)  # type: ignore[arg-type]
    return DIN(tables, num_dense, cfg, dropout)
