"""Model zoo: DLRM, DeepFM, DCN-v2 and DIN over an EmbeddingCollection, built from a config."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from cosparse.batch import SparseBatch
from cosparse.config import Config, ConfigError
from cosparse.nn.dropout import TowerDropout
from cosparse.nn.embedding import EmbeddingCollection
from cosparse.nn.heads import CrossHead, DotHead, FMHead
from cosparse.nn.types import PreparedBatch

if TYPE_CHECKING:
    from cosparse.nn.din import DIN


class RecModel(nn.Module):
    """Base: owns the embedding collection; subclasses map (dense, pooled) to one logit.
    ``dropout``: the towers' dropout (None: none), re-seeded by the trainer every step."""

    def __init__(self, ec: EmbeddingCollection, num_dense: int,
                 dropout: TowerDropout | None = None) -> None:
        super().__init__()
        self.ec = ec
        self.num_dense = num_dense
        self.features = ec.features
        self.dropout = dropout

    def forward(self, batch: SparseBatch | PreparedBatch) -> torch.Tensor:
        raw = batch.batch if isinstance(batch, PreparedBatch) else batch
        pooled = self.ec(batch)
        dense = raw.dense.to(self.ec.device, non_blocking=True)
        return self.interact(dense, [pooled[f] for f in self.features]).squeeze(-1)

    def interact(self, dense: torch.Tensor, embs: list[torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError


class DLRM(DotHead, RecModel):
    """Bottom MLP on dense features, pairwise dot interaction, top MLP (``DotHead``)."""

    def __init__(self, ec: EmbeddingCollection, num_dense: int, bottom: list[int], top: list[int],
                 dropout: TowerDropout | None = None):
        super().__init__(ec, num_dense, dropout)
        self.build_head(num_dense, len(self.features), bottom, top, dropout)


class DeepFM(FMHead, RecModel):
    """FM second-order term + first-order terms + a deep tower over the embeddings and dense
    (``FMHead``)."""

    def __init__(self, ec: EmbeddingCollection, num_dense: int, deep: list[int],
                 dropout: TowerDropout | None = None):
        super().__init__(ec, num_dense, dropout)
        self.build_head(num_dense, len(self.features), ec.dim_of(self.features[0]), deep, dropout)


class DCNv2(CrossHead, RecModel):
    """Cross network (stacked) followed by a deep tower, over [dense, embeddings] (``CrossHead``)."""

    def __init__(self, ec, num_dense, cross_layers: int, rank: int | None, deep: list[int],
                 dropout: TowerDropout | None = None):
        super().__init__(ec, num_dense, dropout)
        width = num_dense + sum(ec.dim_of(f) for f in self.features)
        self.build_head(width, cross_layers, rank, deep, dropout)


def build_model(cfg: Config, num_dense: int, device: torch.device) -> RecModel | DIN:
    """The model named by ``cfg.model.kind`` over the tables of ``cfg``."""
    if cfg.model.kind is None:
        raise ConfigError("model.kind: not set, so the model is your own: train it through "
                          "cosparse.Trainer(model, config), or name a built-in model "
                          "(dlrm, deepfm, dcn, din)")
    # with tiers the trainer swaps in a tiered collection once it has sized the tiers
    budget = None if cfg.store.tiered else cfg.store.device.budget_bytes
    ec = EmbeddingCollection(
        cfg.tables, device=device, budget_bytes=budget,  # type: ignore[arg-type]
        admit_after=cfg.store.admit_after,
    )
    m = cfg.model
    # the towers' dropout: masks from (train.seed, rank, step), whatever the placement
    drop = TowerDropout(m.dropout, cfg.train.seed) if m.dropout else None
    if m.kind == "dlrm":
        model: RecModel = DLRM(ec, num_dense, m.bottom, m.top, drop)
    elif m.kind == "deepfm":
        model = DeepFM(ec, num_dense, m.deep, drop)
    elif m.kind == "dcn":
        model = DCNv2(ec, num_dense, m.cross_layers, m.cross_rank, m.deep, drop)
    elif m.kind == "din":
        from cosparse.nn.din import DIN

        return DIN(ec, num_dense, m.din, drop).to(device)
    else:  # pragma: no cover - config validation rejects it first
        raise ConfigError(f"model.kind: unknown model '{m.kind}'")
    return model.to(device)
