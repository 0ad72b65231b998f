"""Model zoo: DLRM, DeepFM, DCN-v2 and DIN over an EmbeddingCollection, built from a config."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from cosparse.batch import SparseBatch
from cosparse.config import Config, ConfigError
from cosparse.nn.dropout import TowerDropout
from cosparse.nn.embedding import EmbeddingCollection
from cosparse.nn.towers import mlp
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


class _Constant(nn.Module):
    """A learned vector for every sample, whatever its (empty) dense input."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.value = nn.Parameter(torch.zeros(width))

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        return self.value.expand(dense.shape[0], -1)


class DLRM(RecModel):
    """Bottom MLP on dense features, pairwise dot interaction, top MLP."""

    def __init__(self, ec: EmbeddingCollection, num_dense: int, bottom: list[int], top: list[int],
                 dropout: TowerDropout | None = None):
        super().__init__(ec, num_dense, dropout)
        # no dense features: the bottom "MLP" is a learned vector (an MLP of no inputs is its
        # last bias, through the activation)
        self.bottom = (mlp([num_dense, *bottom], last_activation=True, dropout=dropout)
                       if num_dense else _Constant(bottom[-1]))
        n = len(self.features) + 1
        self.register_buffer("_tri", torch.triu_indices(n, n, offset=1), persistent=False)
        self.top = mlp([bottom[-1] + n * (n - 1) // 2, *top], last_activation=False,
                       dropout=dropout)

    def interact(self, dense, embs):
        x = self.bottom(dense)
        t = torch.stack([x, *embs], dim=1)  # [B, F+1, D]
        z = torch.bmm(t, t.transpose(1, 2))
        pairs = z[:, self._tri[0], self._tri[1]]
        return self.top(torch.cat([x, pairs], dim=1))


class DeepFM(RecModel):
    """FM second-order term + first-order terms + a deep tower over the embeddings and dense."""

    def __init__(self, ec: EmbeddingCollection, num_dense: int, deep: list[int],
                 dropout: TowerDropout | None = None):
        super().__init__(ec, num_dense, dropout)
        dim = ec.dim_of(self.features[0])
        nf = len(self.features)
        # no dense features (a feature-platform consumer may have none): no dense first-order term
        self.first_order_dense = nn.Linear(num_dense, 1) if num_dense else None
        # first-order weight of a sparse feature: a learned projection of its embedding
        self.first_order_sparse = nn.Parameter(torch.zeros(nf, dim))
        self.deep = mlp([num_dense + nf * dim, *deep, 1], last_activation=False, dropout=dropout)

    def interact(self, dense, embs):
        e = torch.stack(embs, dim=1)  # [B, F, D]
        square_of_sum = e.sum(dim=1).pow(2)
        sum_of_square = e.pow(2).sum(dim=1)
        fm = 0.5 * (square_of_sum - sum_of_square).sum(dim=1, keepdim=True)
        first = (e * self.first_order_sparse).sum(dim=(1, 2))[:, None]
        if self.first_order_dense is not None:
            first = self.first_order_dense(dense) + first
        deep = self.deep(torch.cat([dense, e.flatten(1)], dim=1))
        return fm + first + deep


class CrossLayer(nn.Module):
    """DCN-v2 cross: x0 * (W x + b) + x, with W full or low-rank (U V^T)."""

    def __init__(self, d: int, rank: int | None) -> None:
        super().__init__()
        if rank is None:
            self.w = nn.Linear(d, d)
        else:
            self.w = nn.Sequential(nn.Linear(d, rank, bias=False), nn.Linear(rank, d))

    def forward(self, x0: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return x0 * self.w(x) + x


class DCNv2(RecModel):
    """Cross network (stacked) followed by a deep tower, over [dense, embeddings]."""

    def __init__(self, ec, num_dense, cross_layers: int, rank: int | None, deep: list[int],
                 dropout: TowerDropout | None = None):
        super().__init__(ec, num_dense, dropout)
        d = num_dense + sum(ec.dim_of(f) for f in self.features)
        self.cross = nn.ModuleList(CrossLayer(d, rank) for _ in range(cross_layers))
        self.deep = mlp([d, *deep, 1], last_activation=False, dropout=dropout)

    def interact(self, dense, embs):
        x0 = torch.cat([dense, *embs], dim=1)
        x = x0
        for layer in self.cross:
            x = layer(x0, x)
        return self.deep(x)


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
