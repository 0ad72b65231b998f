"""The rows of one table on a parameter-server shard (``ShardTable``).

An unbounded host ``Tier`` (the same numba hash map and slab as the host tier) holds each row with
its optimizer state, next to a per-row int64 version, bumped on every write. Unknown IDs are
initialised with ``cosparse.store.resident.initial_rows``, a pure function of (table seed, ID).
Pushed gradients go through ``gather_rows`` and ``SparseOptimizer.update`` on the slab, exactly as
the all-resident engine applies them, so results are bit-identical.

``overhead_nbytes`` sums, from the live structures, the bytes it holds beyond the rows and their
optimizer state (the ID->slot map, per-slot metadata, the free-slot stack, the versions).
"""

from __future__ import annotations

import numpy as np
import torch

from cosparse.config import TableConfig
from cosparse.optim import SparseOptimizer
from cosparse.ps.limits import ShardError
from cosparse.store import kernels
from cosparse.store.resident import initial_rows
from cosparse.store.tier import Tier


class ShardTable:
    """The rows of one table on this shard."""

    def __init__(self, cfg: TableConfig, namespace: str = "default", registered_by: str = "default"
                 ) -> None:
        self.cfg = cfg
        self.namespace = namespace  # the PS namespace it lives in (``cosparse.ps.namespaces``)
        self.registered_by = registered_by  # the namespace whose REGISTER created it
        self.optimizer = SparseOptimizer(cfg.optimizer)
        self.dim = cfg.dim
        self.width = cfg.dim + self.optimizer.state_width(cfg.dim)
        self.tier = Tier(f"ps:{cfg.name}", None, self.width, torch.device("cpu"), policy="lfu",
                         initial_rows=1024)
        self.versions = np.zeros(self.tier.capacity, dtype=np.int64)

    @property
    def label(self) -> str:
        """How errors name it: ``TABLE`` in ``default``, else ``NAMESPACE/TABLE``."""
        return self.cfg.name if self.namespace == "default" else f"{self.namespace}/{self.cfg.name}"

    @property
    def rows(self) -> int:
        return self.tier.size

    def overhead_nbytes(self) -> dict[str, int]:
        """Bytes of every array it holds beside the slab, by structure: ``map.keys``, ``map.vals``
        (the ID->slot map), ``tier.<name>`` (per-slot metadata and the free-slot stack), the
        horizon counts (``future.*``) and ``versions``. Found from the objects themselves, so an
        array added to them later is counted too."""
        out: dict[str, int] = {}
        for prefix, obj in (("tier", self.tier), ("map", self.tier.map), ("future", self.tier.future)):
            for name, v in vars(obj).items():
                if isinstance(v, np.ndarray) and v is not self.tier.slab_np:
                    out[f"{prefix}.{name}"] = int(v.nbytes)
        out["versions"] = int(self.versions.nbytes)
        return out

    def overhead_bytes(self) -> int:
        """Bytes held beyond the slab of rows and optimizer state (``overhead_nbytes``, summed)."""
        return sum(self.overhead_nbytes().values())

    def slab_bytes(self) -> int:
        """Bytes of the slab: every slot (live or free) of rows with their optimizer state."""
        return int(self.tier.capacity) * self.width * 4

    def _fit_versions(self) -> None:
        cap = self.tier.capacity
        if self.versions.shape[0] < cap:
            v = np.zeros(cap, dtype=np.int64)
            v[: self.versions.shape[0]] = self.versions
            self.versions = v

    def slots(self, ids: np.ndarray, create: bool = True, budget: int | None = None) -> np.ndarray:
        """Slots of ``ids``; absent IDs get fresh rows from (table seed, ID) when ``create``.

        ``budget``: at most this many new rows (else ``ShardError('full')``, nothing created)."""
        slots = self.tier.lookup(ids)
        missing = slots < 0
        if create and missing.any():
            new_ids = np.unique(ids[missing])  # duplicates of one new ID share one row
            if budget is not None and new_ids.shape[0] > budget:
                raise ShardError("full", f"table '{self.label}': "
                                         f"{new_ids.shape[0]} new rows do not fit the "
                                         f"{max(budget, 0)} rows left")
            new_slots = self.tier.alloc(new_ids.shape[0])
            self._fit_versions()
            initial_rows(self.cfg, self.width, new_ids, out=self.tier.slab_np, slots=new_slots)
            zeros = np.zeros(new_ids.shape[0], dtype=np.float32)
            self.tier.put(new_ids, new_slots, None, zeros, zeros.astype(np.int64), True)
            self.versions[new_slots] = 0
            slots = self.tier.lookup(ids)
        return slots

    def read(self, slots: np.ndarray, with_state: bool) -> np.ndarray:
        rows = self.tier.read(slots)
        return rows if with_state else np.ascontiguousarray(rows[:, : self.dim])

    def apply(self, slots: np.ndarray, grads: np.ndarray, step: int) -> None:
        """The trainer's update: gather (w, s) from the slab, then the optimizer kernel."""
        u = slots.shape[0]
        w = np.empty((u, self.dim), dtype=np.float32)
        s = np.empty((u, self.width - self.dim), dtype=np.float32)
        kernels.gather_rows(self.tier.slab_np, slots, self.dim, w, s)
        self.optimizer.update(w, s, grads, step, self.tier.slab_np, slots)
        self._touched(slots)

    def write(self, slots: np.ndarray, rows: np.ndarray) -> None:
        self.tier.write(slots, rows)
        self._touched(slots)

    def _touched(self, slots: np.ndarray) -> None:
        self.versions[slots] += 1
        self.tier.dirty[slots] = True
