"""The dense towers of the model zoo: MLPs of Linear and ReLU layers, with dropout after every
hidden activation when the model has it (``model.dropout``)."""

from __future__ import annotations

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
