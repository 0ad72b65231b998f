"""SparseOptimizer: the update rule for embedding rows, dispatched to numba (CPU) or torch (CUDA).

Rows and their optimizer state live side by side in a slab of width ``dim + state_width``.
``update`` takes plain arrays/tensors, so the same rule runs on a device tier, a host tier or
inside a parameter-server shard.
"""

from __future__ import annotations

import numpy as np
import torch

from cosparse.config import OptimizerConfig
from cosparse.optim import kernels

_STATE_MULT = {"sgd": 0, "adagrad": 1, "rowwise_adagrad": 0, "adam": 2}


def state_width(kind: str, dim: int) -> int:
    """Optimizer state floats stored beside each row."""
    if kind not in _STATE_MULT:
        raise ValueError(f"optimizer.kind: unknown sparse optimizer '{kind}'")
    return 1 if kind == "rowwise_adagrad" else _STATE_MULT[kind] * dim


class SparseOptimizer:
    """One of SGD, Adagrad, row-wise Adagrad or Adam, applied to gathered rows."""

    def __init__(self, cfg: OptimizerConfig) -> None:
        self.kind = cfg.kind
        self.lr = np.float32(cfg.lr)
        self.eps = np.float32(cfg.eps)
        self.l2 = np.float32(cfg.l2)
        self.beta1 = np.float32(cfg.beta1)
        self.beta2 = np.float32(cfg.beta2)
        self.initial_state = np.float32(cfg.initial_accumulator if "adagrad" in cfg.kind else 0.0)

    def state_width(self, dim: int) -> int:
        return state_width(self.kind, dim)

    def _corrections(self, step: int) -> tuple[np.float32, np.float32]:
        t = max(int(step), 1)
        return (
            np.float32(1.0 - float(self.beta1) ** t),
            np.float32(1.0 - float(self.beta2) ** t),
        )

    def update(self, w, s, g, step: int, dest, slots) -> None:
        """Update rows: dest[slots[u]] <- rule(w[u], s[u], g[u]) (row and state, side by side).

        numpy arrays run the numba kernels; torch tensors (any device) run the torch version.
        ``step`` is the 1-based global step (used by Adam's bias correction).
        """
        if isinstance(w, np.ndarray):
            self._update_numba(w, s, g, step, dest, slots)
        else:
            self._update_torch(w, s, g, step, dest, slots)

    def _update_numba(self, w, s, g, step, dest, slots) -> None:
        k = self.kind
        if k == "sgd":
            kernels.sgd_update(w, s, g, dest, slots, self.lr, self.l2)
        elif k == "adagrad":
            kernels.adagrad_update(w, s, g, dest, slots, self.lr, self.eps, self.l2)
        elif k == "rowwise_adagrad":
            kernels.rowwise_adagrad_update(w, s, g, dest, slots, self.lr, self.eps, self.l2)
        else:
            c1, c2 = self._corrections(step)
            kernels.adam_update(
                w, s, g, dest, slots, self.lr, self.eps, self.l2, self.beta1, self.beta2, c1, c2
            )

    def _update_torch(self, w, s, g, step, dest, slots) -> None:
        k = self.kind
        lr, eps = float(self.lr), float(self.eps)
        dim = w.shape[1]
        if self.l2:  # the kernels' L2 term: g + l2 * w, on the touched rows
            g = g + float(self.l2) * w
        if k == "sgd":
            new_w, new_s = w - lr * g, s
        elif k == "adagrad":
            new_s = s + g * g
            new_w = w - lr * g / (new_s.sqrt() + eps)
        elif k == "rowwise_adagrad":
            new_s = s + (g * g).sum(dim=1, keepdim=True) * (1.0 / dim)
            new_w = w - (lr / (new_s.sqrt() + eps)) * g
        else:
            b1, b2 = float(self.beta1), float(self.beta2)
            c1, c2 = self._corrections(step)
            m = b1 * s[:, :dim] + (1 - b1) * g
            v = b2 * s[:, dim:] + (1 - b2) * g * g
            new_s = torch.cat([m, v], dim=1)
            new_w = w - lr * (m / float(c1)) / ((v / float(c2)).sqrt() + eps)
        keep = slots >= 0  # negative slots train nothing (IDs not admitted)
        dest.index_copy_(0, slots[keep], torch.cat([new_w, new_s], dim=1)[keep])
