"""The dense heads of the zoo's pooled models (DLRM, DeepFM, DCN-v2): ``nn.Module`` mixins that
build a model's dense layers (``build_head``) and map its dense inputs and its features' pooled
embeddings to one logit (``interact``).

The zoo on the public API (``cosparse.models``, which ``model.kind`` names too) builds its
models' layers through them; the layers, their order and the operations are those of the
built-in models before the zoo moved there, so checkpoints and numbers carry over bit for bit.
"""

from __future__ import annotations

import torch
from torch import nn

from cosparse.nn.dropout import TowerDropout
from cosparse.nn.towers import CrossLayer, mlp


class _Constant(nn.Module):
    """A learned vector for every sample, whatever its (empty) dense input."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.value = nn.Parameter(torch.zeros(width))

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        return self.value.expand(dense.shape[0], -1)


class DotHead(nn.Module):
    """DLRM: bottom MLP on the dense inputs, pairwise dot interaction of its output with every
    feature's pooled embedding, top MLP."""

    def build_head(self, num_dense: int, num_features: int, bottom: list[int], top: list[int],
                   dropout: TowerDropout | None) -> None:
        # no dense features: the bottom "MLP" is a learned vector (an MLP of no inputs is its
        # last bias, through the activation)
        self.bottom = (mlp([num_dense, *bottom], last_activation=True, dropout=dropout)
                       if num_dense else _Constant(bottom[-1]))
        n = num_features + 1
        self.register_buffer("_tri", torch.triu_indices(n, n, offset=1), persistent=False)
        self.top = mlp([bottom[-1] + n * (n - 1) // 2, *top], last_activation=False,
                       dropout=dropout)

    def interact(self, dense: torch.Tensor, embs: list[torch.Tensor]) -> torch.Tensor:
        x = self.bottom(dense)
        t = torch.stack([x, *embs], dim=1)  # [B, F+1, D]
        z = torch.bmm(t, t.transpose(1, 2))
        pairs = z[:, self._tri[0], self._tri[1]]
        return self.top(torch.cat([x, pairs], dim=1))


class FMHead(nn.Module):
    """DeepFM: FM second-order term + first-order terms + a deep tower over the embeddings and
    the dense inputs."""

    def build_head(self, num_dense: int, num_features: int, dim: int, deep: list[int],
                   dropout: TowerDropout | None) -> None:
        # no dense features (a feature-platform consumer may have none): no dense first-order term
        self.first_order_dense = nn.Linear(num_dense, 1) if num_dense else None
        # first-order weight of a sparse feature: a learned projection of its embedding
        self.first_order_sparse = nn.Parameter(torch.zeros(num_features, dim))
        self.deep = mlp([num_dense + num_features * dim, *deep, 1], last_activation=False,
                        dropout=dropout)

    def interact(self, dense: torch.Tensor, embs: list[torch.Tensor]) -> torch.Tensor:
        e = torch.stack(embs, dim=1)  # [B, F, D]
        square_of_sum = e.sum(dim=1).pow(2)
        sum_of_square = e.pow(2).sum(dim=1)
        fm = 0.5 * (square_of_sum - sum_of_square).sum(dim=1, keepdim=True)
        first = (e * self.first_order_sparse).sum(dim=(1, 2))[:, None]
        if self.first_order_dense is not None:
            first = self.first_order_dense(dense) + first
        deep = self.deep(torch.cat([dense, e.flatten(1)], dim=1))
        return fm + first + deep


class CrossHead(nn.Module):
    """DCN-v2: a stack of cross layers followed by a deep tower, over [dense, embeddings]."""

    def build_head(self, width: int, cross_layers: int, rank: int | None, deep: list[int],
                   dropout: TowerDropout | None) -> None:
        self.cross = nn.ModuleList(CrossLayer(width, rank) for _ in range(cross_layers))
        self.deep = mlp([width, *deep, 1], last_activation=False, dropout=dropout)

    def interact(self, dense: torch.Tensor, embs: list[torch.Tensor]) -> torch.Tensor:
        x0 = torch.cat([dense, *embs], dim=1)
        x = x0
        for layer in self.cross:
            x = layer(x0, x)
        return self.deep(x)
