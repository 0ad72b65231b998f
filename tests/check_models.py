"""Models of a user's own for ``cosparse check``'s tests: the public API's model with dropout
drawn from torch's global generator (which the trainer seeds from ``train.seed`` and a
checkpoint restores, so it is reproducible), and with dropout whose generator is seeded from
the operating system's entropy instead of the step: deliberately non-deterministic."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from public_model import UserModel


class GlobalDropout(UserModel):
    """Dropout on the logits from torch's global generator."""

    def forward(self, batch):
        return F.dropout(super().forward(batch), 0.3, training=True)


class EntropyDropout(UserModel):
    """Dropout on the logits with masks from a generator seeded by the OS: each run differs."""

    def __init__(self) -> None:
        super().__init__()
        self.masks = torch.Generator()
        self.masks.seed()  # (a non-deterministic seed, not the step's)

    def forward(self, batch):
        logits = super().forward(batch)
        keep = torch.rand(logits.shape, generator=self.masks) >= 0.3
        return logits * keep / 0.7
