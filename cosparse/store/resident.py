"""ResidentTable: every row of one table resident in one slab (rows and optimizer state side by
side), with a dynamic vocabulary. This is the reference placement that tiered stores must match.
"""

from __future__ import annotations

import numpy as np
import torch

from cosparse.config import TableConfig
from cosparse.optim import NonFiniteUpdate, SparseOptimizer
from cosparse.store import kernels
from cosparse.store.dedup import map_ids
from cosparse.store.hashmap import IdMap
from cosparse.store.prefault import SpareRows
from cosparse.store.types import BatchPlan, DeliveredRowSource, RowSource, TableCounters
from cosparse.waits import CountedLock

_INIT_KIND = {"uniform": 0, "normal": 1}


def initial_rows(
    cfg: TableConfig, width: int, ids: np.ndarray, out: np.ndarray | None = None,
    serial: bool = False, slots: np.ndarray | None = None,
) -> np.ndarray:
    """Fresh rows+state for ``ids``: a pure function of (table seed, ID), wherever it is called.

    Written to ``out[slots]`` (default: rows 0..n-1 of ``out`` or of a new array). ``serial``
    runs single-threaded (for the planner's background thread); the values are the same.
    """
    init = cfg.init
    a, b = (init.low, init.high) if init.kind == "uniform" else (init.std, 0.0)
    if out is None:
        out = np.empty((ids.shape[0], width), dtype=np.float32)
    state0 = SparseOptimizer(cfg.optimizer).initial_state
    kernel = kernels.init_rows_serial if serial else kernels.init_rows
    rows = np.arange(ids.shape[0]) if slots is None else slots
    kernel(out, rows, ids, cfg.seed, cfg.dim, _INIT_KIND[init.kind], a, b, state0,
           cfg.column_offset)
    return out


class SlabRows:
    """Gather and optimizer update through a device slab: shared by every table placement.

    The defaults are an all-resident table's (``TablePlacement`` in ``cosparse.store.types``):
    nothing cached to count, no pins, every row in this process."""

    counters: TableCounters | None = None
    pins_rows = False
    rows_on_ps = False
    ps_backed = False
    late_fill_ms = 0.0  # time spent filling rows at the gather (ps-direct's deferred pulls)

    def _init_layout(self, cfg: TableConfig, device: torch.device) -> None:
        """The row layout: values then optimizer state, side by side; reused gather buffers."""
        self.cfg = cfg
        self.device = device
        self.optimizer = SparseOptimizer(cfg.optimizer)
        self.dim = cfg.dim
        self.width = cfg.dim + self.optimizer.state_width(cfg.dim)
        self.row_bytes = 4 * self.width
        self._w_buf = torch.empty(0, self.dim, device=device)
        self._s_buf = torch.empty(0, self.width - self.dim, device=device)
        # the trainer reads and updates rows while the planner thread may reallocate the slab
        self._slab_lock = CountedLock("lock.slab")

    @property
    def slab_array(self) -> np.ndarray | None:
        """The device slab as a numpy array (CPU), or None on CUDA."""
        raise NotImplementedError

    @property
    def slab(self) -> torch.Tensor:
        raise NotImplementedError

    def gather(self, slots: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows and state of ``slots`` into reused compact buffers (views [U, dim], [U, sw])."""
        u = slots.shape[0]
        if self._w_buf.shape[0] < u:
            cap = max(u, int(self._w_buf.shape[0] * 1.5))
            self._w_buf = torch.empty(cap, self.dim, device=self.device)
            self._s_buf = torch.empty(cap, self.width - self.dim, device=self.device)
        w, s = self._w_buf[:u], self._s_buf[:u]
        with self._slab_lock:
            arr = self.slab_array
            if arr is not None:
                kernels.gather_rows(arr, slots, self.dim, w.numpy(), s.numpy())
            else:
                idx = torch.from_numpy(slots).to(self.device)
                rows = self.slab.index_select(0, idx.clamp(min=0))
                rows[idx < 0] = 0.0  # not admitted: the shared default (zero) row
                w.copy_(rows[:, : self.dim])
                s.copy_(rows[:, self.dim :])
        return w, s

    def apply_gradients(
        self, w: torch.Tensor, s: torch.Tensor, g: torch.Tensor, slots: np.ndarray, step: int
    ) -> None:
        """Optimizer update of the gathered rows, written straight back into the slab; one that
        would make a row or its state non-finite is refused whole (``NonFiniteUpdate``, exit 8)."""
        with self._slab_lock:
            arr = self.slab_array
            try:
                if arr is not None:
                    self.optimizer.update(w.numpy(), s.numpy(), g.contiguous().numpy(), step, arr,
                                          slots)
                else:
                    dev_slots = torch.from_numpy(slots).to(self.device)
                    self.optimizer.update(w, s, g, step, self.slab, dev_slots)
            except NonFiniteUpdate as e:
                raise e.named(self.cfg.name) from None

    # planning hooks: an all-resident table needs no pins, and has no misses to fill
    def row_sources(self, delivered: DeliveredRowSource | None = None) -> list[RowSource]:
        return []

    def fill(self, plan: BatchPlan, sources: list[RowSource]) -> None:
        pass

    def write_back(self, step: int) -> None:
        pass

    def release(self, seq: int) -> None:
        pass

    def release_all(self) -> None:
        pass

    def observe_future(self, unique: np.ndarray, delta: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def device_bytes(self) -> tuple[int, int]:
        """(bytes held, capacity in bytes) of a bounded device tier; (0, 0) without one."""
        return 0, 0

    def drop_local_rows(self) -> None:
        """Forget what this process holds of the table (a restored PS holds every row)."""
        self.release_all()

    def map_ids(self, ids: np.ndarray) -> np.ndarray:
        """Apply the optional modulo of ``hash_size``; IDs are unbounded otherwise."""
        return map_ids(ids, self.cfg.hash_size)


class BudgetExceeded(RuntimeError):
    """The table would outgrow its share of the configured device budget."""


class ResidentTable(SlabRows):
    """All rows of a table on one device (a numpy slab on CPU, a torch tensor on CUDA)."""

    def __init__(
        self,
        cfg: TableConfig,
        device: torch.device,
        max_bytes: int | None = None,
    ) -> None:
        self._init_layout(cfg, device)
        self.max_bytes = max_bytes
        self.ids = IdMap(expected=cfg.num_embeddings or 65536)
        self._ids_lock = CountedLock("lock.ids")
        rows = cfg.num_embeddings or 65536
        if max_bytes is not None:
            rows = max(1, min(rows, max_bytes // self.row_bytes))
        self._slab_np: np.ndarray | None = None
        self._spare: SpareRows | None = None
        self.slab = self._alloc(rows)

    # --- storage ------------------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        return self.ids.size

    @property
    def capacity(self) -> int:
        return int(self.slab.shape[0])

    def _alloc(self, rows: int) -> torch.Tensor:
        if self.device.type == "cpu":
            # numpy-allocated slabs get transparent huge pages; torch.from_numpy shares them.
            self._slab_np = np.empty((rows, self.width), dtype=np.float32)
            if self._spare is not None:
                self._spare.close()
            self._spare = SpareRows(self._slab_np)  # new rows' pages, faulted in ahead
            self._spare.ahead(self.num_rows, 0)
            return torch.from_numpy(self._slab_np)
        return torch.empty(rows, self.width, dtype=torch.float32, device=self.device)

    def _grow(self, rows_needed: int, valid_rows: int) -> None:
        new_rows = max(rows_needed, 2 * self.capacity)
        if self.max_bytes is not None:
            limit = self.max_bytes // self.row_bytes
            if rows_needed > limit:
                raise BudgetExceeded(
                    f"table '{self.cfg.name}' needs {rows_needed} rows "
                    f"({rows_needed * self.row_bytes} bytes) but its share of "
                    f"store.device.budget_bytes holds {limit} rows"
                )
            new_rows = min(new_rows, limit)
        with self._slab_lock:  # no gather or update may touch the old slab meanwhile
            old = self.slab
            self.slab = self._alloc(new_rows)
            self.slab[:valid_rows].copy_(old[:valid_rows])

    # --- ID work --------------------------------------------------------------------------
    def slots_for(self, unique: np.ndarray) -> np.ndarray:
        """Slots of unique IDs; new IDs get rows initialised from (table seed, ID). The insert,
        the slab growth and the new rows' initialisation are one step under the ID-map lock, so
        an export (a checkpoint) never sees an ID whose row is not there yet."""
        with self._ids_lock:
            slots, first_new = self.ids.lookup_or_insert(unique)
            n = self.ids.size
            if n > first_new:
                if n > self.capacity:
                    self._grow(n, first_new)
                new_slots = np.arange(first_new, n, dtype=np.int64)
                new_ids = unique[slots >= first_new]
                self._init_rows(new_slots, new_ids)
                if self._spare is not None:
                    self._spare.ahead(n, n - first_new)
        return slots

    def initial_rows(self, ids: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Fresh rows+state for ``ids``: a pure function of (table seed, ID)."""
        return initial_rows(self.cfg, self.width, ids, out)

    def _init_rows(self, slots: np.ndarray, ids: np.ndarray) -> None:
        if self._slab_np is not None and slots.shape[0] and slots[-1] - slots[0] + 1 == len(slots):
            self.initial_rows(ids, out=self._slab_np[slots[0] : slots[-1] + 1])
        else:
            rows = torch.from_numpy(self.initial_rows(ids)).to(self.device)
            self.slab[torch.from_numpy(slots).to(self.device)] = rows

    def read_rows(self, unique: np.ndarray) -> torch.Tensor:
        """Rows of ``unique`` without creating any: unseen IDs read their initial value.

        Used for evaluation, which must not change the table.
        """
        with self._ids_lock:  # the planner thread may be inserting (and rehashing) meanwhile
            slots = self.ids.lookup(unique)
        found = slots >= 0
        out = torch.empty(unique.shape[0], self.dim, device=self.device)
        if found.any():
            with self._slab_lock:
                out[torch.from_numpy(found).to(self.device)] = self.slab[
                    torch.from_numpy(slots[found]).to(self.device), : self.dim
                ]
        if not found.all():
            fresh = self.initial_rows(unique[~found])[:, : self.dim]
            out[torch.from_numpy(~found).to(self.device)] = torch.from_numpy(fresh).to(self.device)
        return out

    @property
    def slab_array(self) -> np.ndarray | None:
        return self._slab_np

    @property
    def slab(self) -> torch.Tensor:
        return self._slab

    @slab.setter
    def slab(self, value: torch.Tensor) -> None:
        self._slab = value

    def plan(self, unique: np.ndarray, seq: int, shrink: object = None) -> BatchPlan:
        """Every row in place (a new ID's row is created here, from its initial value)."""
        return BatchPlan.resident(self.slots_for(unique), seq)

    # --- checkpoint -----------------------------------------------------------------------
    def export(self) -> dict[str, np.ndarray]:
        """IDs (ordered by slot) and their rows+state (the planner thread may be creating rows
        for batches ahead meanwhile: the ID-map lock makes the two consistent)."""
        with self._ids_lock:
            ids, slots = self.ids.items()
            with self._slab_lock:
                rows = self.slab[: ids.shape[0]].cpu().numpy().copy()
        return {"ids": ids, "rows": rows[slots]}

    def load(self, state: dict[str, np.ndarray]) -> None:
        ids, rows = state["ids"], state["rows"]
        if rows.shape[1] != self.width:
            raise ValueError(
                f"table '{self.cfg.name}': checkpoint rows have width {rows.shape[1]}, "
                f"config needs {self.width} (dim + optimizer state)"
            )
        self.ids = IdMap.from_items(ids, np.arange(ids.shape[0]))
        if ids.shape[0] > self.capacity:
            self.slab = self._alloc(max(ids.shape[0], self.capacity))
        self.slab[: ids.shape[0]] = torch.from_numpy(rows).to(self.device)
