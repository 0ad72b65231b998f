"""The rows of one table on a parameter-server shard (``ShardTable``).

Its own lean store, which the fused kernels of ``shard_kernels`` work on: an ID -> slot map
(the same open addressing and hashing as the host tier's), a slab of rows with their optimizer
state side by side, and per slot the ID, an int64 version (bumped on every write) and a dirty
flag. Rows are never removed, so the live slots are ``0 .. rows-1``; the map and the per-slot
arrays grow when a request needs room. Unknown IDs are initialised from (table seed, ID), exactly
as ``cosparse.store.resident.initial_rows``; pushed gradients run the all-resident engine's row
functions (``cosparse.optim.kernels``), so results are bit-identical.

``pull`` and ``push`` answer a request in one kernel call (``threads`` > 1: their row passes run
on that many numba threads; each row on one thread). Refused requests raise ``ShardError`` and
change nothing.

``overhead_nbytes`` sums, from the live arrays, the bytes it holds beyond the rows and their
optimizer state (the ID->slot map, the per-slot versions and flags, the per-request scratch;
no slot->ID array: ``ids_by_slot`` reads the map).
"""

from __future__ import annotations

import numpy as np

from cosparse.config import TableConfig
from cosparse.optim import SparseOptimizer, state_width
from cosparse.optim.kernels import KIND_CODES
from cosparse.ps import shard_kernels as K
from cosparse.ps.limits import ShardError
from cosparse.ps.protocol import shard_of

_INIT_KIND = {"uniform": 0, "normal": 1}
_MAX_LOAD = 0.7  # the map's largest load factor
_NO_LIMIT = 1 << 62
INITIAL_ROWS = 1024  # the rows a new table reserves (what REGISTER charges to the byte budget)


def row_bytes(cfg: TableConfig) -> int:
    """What one row of table ``cfg`` costs a shard (what ``ps serve --max-bytes`` counts): its
    values and optimizer state (float32), its version (int64) and flags (uint8), and its share of
    the ID -> slot map (an int64 key and an int32 slot per bucket; at most 2 / ``_MAX_LOAD``
    buckets per row, the map being a power of two at most ``_MAX_LOAD`` full)."""
    width = cfg.dim + state_width(cfg.optimizer.kind, cfg.dim)
    return 4 * width + 8 + 1 + int(np.ceil(2 * 12 / _MAX_LOAD))


def _pow2_at_least(n: int) -> int:
    return 1 << max(4, int(n - 1).bit_length())


class ShardTable:
    """The rows of one table on this shard."""

    def __init__(self, cfg: TableConfig, namespace: str = "default", registered_by: str = "default",
                 initial_rows: int = INITIAL_ROWS, threads: int = 1) -> None:
        self.cfg = cfg
        self.namespace = namespace  # the PS namespace it lives in (``cosparse.ps.namespaces``)
        self.registered_by = registered_by  # the namespace whose REGISTER created it
        self.optimizer = SparseOptimizer(cfg.optimizer)
        self.dim = cfg.dim
        self.width = cfg.dim + self.optimizer.state_width(cfg.dim)
        self.row_bytes = row_bytes(cfg)
        self.size = 0
        cap = _pow2_at_least(int(initial_rows / _MAX_LOAD) + 1)
        self.keys = np.zeros(cap, dtype=np.int64)
        self.vals = np.full(cap, -1, dtype=np.int32)
        self._alloc_rows(initial_rows)
        init = cfg.init
        a, b = (init.low, init.high) if init.kind == "uniform" else (init.std, 0.0)
        # initial rows: the arguments of ``initial_rows``'s kernel, with the same types
        self._init = (int(cfg.seed), int(cfg.dim), _INIT_KIND[init.kind], float(a), float(b),
                      self.optimizer.initial_state, int(cfg.column_offset))
        o = self.optimizer
        self._kind = KIND_CODES[o.kind]
        self._rule = (o.lr, o.eps, o.l2, o.beta1, o.beta2)
        self._slots = np.empty(0, dtype=np.int64)  # per-request scratch, reused
        self._marks = np.empty(0, dtype=np.uint8)
        self._new_ids = np.empty(0, dtype=np.int64)
        self._undo = np.empty((0, self.width), dtype=np.float32)  # a push's rows before it
        self.threads = threads  # > 1: the parallel kernels, on numba's threads

    def _alloc_rows(self, cap: int) -> None:
        # every slot is written before it is read, so the slab needs no zero fill
        self.slab = np.empty((cap, self.width), dtype=np.float32)
        self.versions = np.zeros(cap, dtype=np.int64)
        self.flags = np.zeros(cap, dtype=np.uint8)

    @property
    def label(self) -> str:
        """How errors name it: ``TABLE`` in ``default``, else ``NAMESPACE/TABLE``."""
        return self.cfg.name if self.namespace == "default" else f"{self.namespace}/{self.cfg.name}"

    @property
    def rows(self) -> int:
        return self.size

    @property
    def charged_bytes(self) -> int:
        """What it counts against its shard's byte budget: ``row_bytes`` for every slot of its
        arrays, live or not yet used (they grow within the budget: ``_grow``)."""
        return self.capacity * self.row_bytes

    @property
    def capacity(self) -> int:
        """Slots of the slab (live or not yet used)."""
        return int(self.slab.shape[0])

    @property
    def dirty(self) -> np.ndarray:
        """Per live slot: written since the last snapshot."""
        return (self.flags[: self.size] & K.DIRTY) != 0

    def clean(self, slots: np.ndarray | None = None) -> None:
        """Mark ``slots`` (default: every row) as in the last snapshot."""
        if slots is None:
            self.flags[: self.size] &= ~K.DIRTY
        else:
            self.flags[slots] &= ~K.DIRTY

    def occupied_slots(self) -> np.ndarray:
        return np.arange(self.size, dtype=np.int64)

    # --- memory -------------------------------------------------------------------------------
    def overhead_nbytes(self) -> dict[str, int]:
        """Bytes of every array it holds beside the slab, by name (``map.keys``, ``map.vals``,
        ``versions``, ``flags``, and the per-request scratch). Found from the object
        itself, so an array added to it later is counted too."""
        out: dict[str, int] = {}
        for name, v in vars(self).items():
            if isinstance(v, np.ndarray) and v is not self.slab:
                key = {"keys": "map.keys", "vals": "map.vals"}.get(name, name.lstrip("_"))
                out[key] = int(v.nbytes)
        return out

    def overhead_bytes(self) -> int:
        """Bytes held beyond the slab of rows and optimizer state (``overhead_nbytes``, summed)."""
        return sum(self.overhead_nbytes().values())

    def slab_bytes(self) -> int:
        """Bytes of the slab: every slot (live or not yet used) of rows with their optimizer state."""
        return int(self.slab.nbytes)

    def _grow(self, extra: int, budget: int | None = None) -> None:
        """Room for ``extra`` more rows: the map (rehashed) and the per-slot arrays (copied, to
        twice the capacity, but to no more than ``budget`` rows beyond those it holds: the
        kernels refuse a request past that limit before they ask for room)."""
        need = self.size + extra
        if need > _MAX_LOAD * self.keys.shape[0]:
            cap = _pow2_at_least(int(need / _MAX_LOAD) + 1)
            keys = np.zeros(cap, dtype=np.int64)
            vals = np.full(cap, -1, dtype=np.int32)
            K.rehash(self.keys, self.vals, keys, vals)
            self.keys, self.vals = keys, vals
        if need > self.capacity:
            old = (self.slab, self.versions, self.flags)
            most = _NO_LIMIT if budget is None else self.size + max(budget, 0)
            self._alloc_rows(max(self.capacity + 1, min(max(2 * self.capacity, need), most)))
            n = self.size
            for new, prev in zip((self.slab, self.versions, self.flags), old,
                                 strict=True):
                new[:n] = prev[:n]

    def _room(self) -> int:
        """The slots the kernels may fill before the map or the arrays must grow."""
        return min(self.capacity, int(_MAX_LOAD * self.keys.shape[0]))

    def _scratch(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(slots, marks) for a request of ``n`` IDs, and room for as many new IDs."""
        if self._slots.shape[0] < n:
            self._slots = np.empty(max(n, 2 * self._slots.shape[0]), dtype=np.int64)
            self._marks = np.empty(self._slots.shape[0], dtype=np.uint8)
            self._new_ids = np.empty(self._slots.shape[0], dtype=np.int64)
        return self._slots[:n], self._marks[:n]

    def ids_by_slot(self) -> np.ndarray:
        """The ID of each live slot: one pass over the whole map (for snapshots and dumps)."""
        out = np.empty(self.size, dtype=np.int64)
        K.slot_keys(self.keys, self.vals, out)
        return out

    # --- requests -----------------------------------------------------------------------------
    def pull(self, ids: np.ndarray, with_state: bool, peek: bool, budget: int | None,
             shard: int = 0, num_shards: int = 1, out: tuple[np.ndarray, np.ndarray] | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
        """(rows [n, dim] or [n, width], versions [n]) of ``ids``, into ``out`` when given.
        Absent IDs get new rows (at most ``budget`` of them), unless ``peek``: then they read
        their initial value with version -1, and nothing changes."""
        n = ids.shape[0]
        if out is None:
            out = (np.empty((n, self.width if with_state else self.dim), dtype=np.float32),
                   np.empty(n, dtype=np.int64))
        rows, versions = out
        kernel = K.pull_parallel if self.threads > 1 else K.pull_serial
        limit = _NO_LIMIT if budget is None else self.size + max(budget, 0)
        while True:
            slots, marks = self._scratch(n)
            size, status, at = kernel(self.keys, self.vals, self._new_ids, self.slab,
                                      self.versions, self.flags, self.size, ids, shard,
                                      num_shards, not peek, limit, self._room(), *self._init,
                                      rows, versions, slots, marks)
            if status != K.ROOM:
                break
            self._grow(n, budget)
        self._raise(status, at, ids, budget, shard, num_shards)
        self.size = int(size)
        return rows, versions

    def push(self, ids: np.ndarray, grads: np.ndarray, step: int, budget: int | None,
             shard: int = 0, num_shards: int = 1) -> None:
        """The trainer's update of unique ``ids`` with ``grads`` [n, dim] at 1-based ``step``:
        the optimizer on each row in place, its version + 1. Absent IDs get their initial row
        first (at most ``budget`` of them)."""
        n = ids.shape[0]
        kernel = K.push_parallel if self.threads > 1 else K.push_serial
        limit = _NO_LIMIT if budget is None else self.size + max(budget, 0)
        c1, c2 = self.optimizer._corrections(step)
        if self._undo.shape[0] < n:  # (a push's only: a pull never needs it)
            self._undo = np.empty((max(n, 2 * self._undo.shape[0]), self.width), dtype=np.float32)
        while True:
            slots, marks = self._scratch(n)
            size, status, at = kernel(self.keys, self.vals, self._new_ids, self.slab,
                                      self.versions, self.flags, self.size, ids, grads, shard,
                                      num_shards, limit, self._room(), *self._init, self._kind,
                                      *self._rule, c1, c2, slots, marks, self._undo[:n])
            if status != K.ROOM:
                break
            self._grow(n, budget)
        self._raise(status, at, ids, budget, shard, num_shards, grads)
        self.size = int(size)

    def slots(self, ids: np.ndarray, create: bool = True, budget: int | None = None) -> np.ndarray:
        """Slots of ``ids`` (-1: absent); absent IDs get fresh rows from (table seed, ID) when
        ``create``. ``budget``: at most this many new rows (else ``ShardError('full')``, nothing
        created)."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        limit = _NO_LIMIT if budget is None else self.size + max(budget, 0)
        out = np.empty(ids.shape[0], dtype=np.int64)
        new_ids = np.empty(ids.shape[0], dtype=np.int64)
        while True:
            size, status = K.find_or_add(self.keys, self.vals, new_ids, self.slab, self.versions,
                                         self.flags, self.size, ids, create, limit, self._room(),
                                         *self._init, out)
            if status != K.ROOM:
                break
            self._grow(ids.shape[0], budget)
        self._raise(status, -1, ids, budget, 0, 1)
        self.size = int(size)
        return out

    def _raise(self, status: int, at: int, ids: np.ndarray, budget: int | None, shard: int,
               num_shards: int, grads: np.ndarray | None = None) -> None:
        """The error of a refused request (the kernel changed nothing)."""
        if status == K.OK:
            return
        if status == K.NOT_FINITE and grads is not None:
            check_finite(self.label, "gradients", ids, grads)
        if status == K.NOT_FINITE_RESULT:
            raise NonFiniteResult(
                f"table '{self.label}': refused a push whose result would be NaN or infinite in "
                f"row ID {int(ids[at])} (its values or {self.optimizer.kind} state overflow "
                "float32: gradients too large for the learning rate); nothing was applied "
                "(lower tables[*].optimizer.lr, or check the data for huge values)")
        if status == K.FOREIGN:
            foreign = shard_of(ids, num_shards) != shard
            raise ShardError("owner", f"shard {shard}/{num_shards} does not own "
                                      f"{int(foreign.sum())} of the IDs (e.g. "
                                      f"{ids[foreign][:3].tolist()})")
        if status == K.DUPLICATE:
            raise ShardError("request", "pushed IDs must be unique (sum their gradients first)")
        if status == K.FULL:
            known = np.empty(ids.shape[0], dtype=np.int64)
            K.find_or_add(self.keys, self.vals, np.empty(0, dtype=np.int64), self.slab,
                          self.versions, self.flags, self.size, ids, False, 0, 0, *self._init, known)
            new = np.unique(ids[known < 0]).shape[0]
            raise ShardError("full", f"table '{self.label}': {new} new rows do not fit the "
                                     f"{max(budget or 0, 0)} rows left")
        raise RuntimeError(f"table '{self.label}': kernel status {status}")

    def read(self, slots: np.ndarray, with_state: bool) -> np.ndarray:
        """Copy of the rows at ``slots`` (with their optimizer state when ``with_state``)."""
        return self.slab[slots] if with_state else self.slab[slots, : self.dim]

    def write(self, slots: np.ndarray, rows: np.ndarray) -> None:
        """Overwrite rows and their state at ``slots``; their versions + 1, dirty."""
        self.slab[slots] = rows
        self.versions[slots] += 1
        self.flags[slots] |= K.DIRTY


class NonFiniteResult(ShardError):
    """A PUSH refused whole: a row's new values or optimizer state would be NaN or infinite."""

    def __init__(self, message: str) -> None:
        super().__init__("nonfinite", message)


def check_finite(table: str, what: str, ids: np.ndarray, values: np.ndarray) -> None:
    """Refuse NaN or infinite values: one would poison a row for good."""
    ok = np.isfinite(values).all(axis=1)
    if not ok.all():
        bad = np.flatnonzero(~ok)
        raise ShardError("nonfinite", f"table '{table}': refused {what} with NaN or infinite values "
                                    f"in {bad.shape[0]} of {ids.shape[0]} rows (e.g. ID "
                                    f"{int(ids[bad[0]])}); nothing was applied")
