"""The dense towers of the model zoo: MLPs of Linear and ReLU layers, with dropout after every
hidden activation when the model has it (``model.dropout``), and DCN-v2's cross layer."""

from __future__ import annotations

import torch
from torch import nn

from cosparse.nn.dropout import TowerDropout


def mlp(sizes: list[int], last_activation: bool, dropout: TowerDropout | None = None
        ) -> nn.Sequential:
    """Linear layers ``sizes[0] -> ... -> sizes[-1]``, a ReLU after each but the last (and after
    the last too with ``last_activation``), each ReLU followed by a dropout layer of
    ``dropout``. The ReLU and its dropout share one position, so the Linear layers keep their
    indices: the state-dict keys (and checkpoints) are the same with or without dropout."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_activation:
            layers.append(nn.ReLU() if dropout is None
                          else nn.Sequential(nn.ReLU(), dropout.layer()))
    return nn.Sequential(*layers)


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
