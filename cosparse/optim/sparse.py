"""SparseOptimizer: the update rule for embedding rows, dispatched to numba (CPU) or torch (CUDA).

Rows and their optimizer state live side by side in a slab of width ``dim + state_width``.
``update`` takes plain arrays/tensors, so the same rule runs on a device tier, a host tier or
inside a parameter-server shard. A shard passes numpy arrays only, so this module does not import
torch (a shard process starts without it: 1.4 s less per start).
"""

from __future__ import annotations

import numpy as np

from cosparse.config import OptimizerConfig
from cosparse.optim import kernels
from cosparse.optim.kernels import KIND_CODES

_STATE_MULT = {"sgd": 0, "adagrad": 1, "rowwise_adagrad": 0, "adam": 2}


def state_width(kind: str, dim: int) -> int:
    """Optimizer state floats stored beside each row."""
    if kind not in _STATE_MULT:
        raise ValueError(f"optimizer.kind: unknown sparse optimizer '{kind}'")
    return 1 if kind == "rowwise_adagrad" else _STATE_MULT[kind] * dim


class NonFiniteUpdate(RuntimeError):
    """An optimizer update that would have made rows or their state NaN or infinite (a huge
    gradient overflows float32: Adagrad's accumulator after 1e20, an SGD row after repeated
    3e38); refused as a whole, nothing applied. ``table``: set by the store that applied it."""

    def __init__(self, kind: str, rows: int, total: int, step: int, table: str | None = None
                 ) -> None:
        self.kind, self.rows, self.total, self.step, self.table = kind, rows, total, step, table
        where = f"table '{table}'" if table else "a table"
        super().__init__(
            f"{where}: the {kind} update at step {step} would make {rows} of {total} rows (or "
            "their optimizer state) NaN or infinite; refused, nothing applied to the table. "
            "Lower the learning rate (tables[*].optimizer.lr) or check the data for huge values")

    def named(self, table: str) -> NonFiniteUpdate:
        """The same refusal, naming ``table``."""
        return NonFiniteUpdate(self.kind, self.rows, self.total, self.step, table)


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
        ``step`` is the 1-based global step (used by Adam's bias correction). All or nothing:
        when any row's new values or state would be NaN or infinite, nothing is written and
        ``NonFiniteUpdate`` is raised.
        """
        if isinstance(w, np.ndarray):
            self._update_numba(w, s, g, step, dest, slots)
        else:
            self._update_torch(w, s, g, step, dest, slots)

    def _update_numba(self, w, s, g, step, dest, slots) -> None:
        if np.may_share_memory(dest, w) or np.may_share_memory(dest, s):  # w, s: the undo copy
            raise ValueError("SparseOptimizer.update: dest must not overlap the gathered rows")
        c1, c2 = self._corrections(step)
        bad = kernels.update_checked(KIND_CODES[self.kind], w, s, g, dest, slots, self.lr,
                                     self.eps, self.l2, self.beta1, self.beta2, c1, c2)
        if bad:
            raise NonFiniteUpdate(self.kind, int(bad), int((slots >= 0).sum()), step)

    def _update_torch(self, w, s, g, step, dest, slots) -> None:
        import torch  # (here, not at the top: a PS shard runs the numba rule and never loads torch)

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
        new = torch.cat([new_w, new_s], dim=1)[keep]
        finite = torch.isfinite(new).all(dim=1)
        if not bool(finite.all()):  # all or nothing, as the numba kernel
            raise NonFiniteUpdate(self.kind, int((~finite).sum()), int(keep.sum()), step)
        dest.index_copy_(0, slots[keep], new)
