"""Tier: one level of a table's rows (device, host or a backing store).

A slab of rows with their optimizer state side by side, its own ID->slot map, and per-slot
metadata: the ID held, occupancy, a dirty bit (the tier below has no identical copy), a pin count
(rows a batch in the lookahead window needs) and the hotness/recency figures eviction uses.
Bounded tiers have a fixed number of slots; unbounded ones grow.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from cosparse.store import kernels
from cosparse.store.hashmap import IdMap
from cosparse.store.prefault import SpareRows

POLICIES = {"lru": kernels.POLICY_LRU, "lfu": kernels.POLICY_LFU, "hotness": kernels.POLICY_HOTNESS}


class FutureUses:
    """The planning horizon of a device tier (``kernels.future``): ID -> tag of the latest batch
    in the horizon that needs it. Batches are tagged 1, 2, ... as they ``enter`` and ``leave`` in
    that order; an ID (and a device slot, through the tier's ``wanted``) is needed while its tag
    is above ``left``. Leaving costs nothing: stale entries go when the map is rebuilt."""

    def __init__(self) -> None:
        self.keys = np.zeros(0, dtype=np.int64)
        self.vals = np.zeros(0, dtype=np.int32)
        self.size = 0  # keys held, live or stale
        self.entered = 0
        self.left = 0

    def enter(self, ids: np.ndarray, dev_map: IdMap, wanted: np.ndarray) -> None:
        """A batch's unique ``ids`` enter the horizon; the device rows among them (``dev_map``)
        get its tag in ``wanted``."""
        if self.size + ids.shape[0] > 0.7 * self.keys.shape[0]:
            self._rebuild(ids.shape[0])
        self.entered += 1
        self.size += int(kernels.future_enter(self.keys, self.vals, ids, self.entered,
                                              dev_map.keys, dev_map.vals, wanted))

    def leave(self) -> None:
        """The oldest batch in the horizon leaves it (to be planned)."""
        self.left += 1

    def _rebuild(self, extra: int) -> None:
        """Drop the stale entries, sized so the live ones and ``extra`` fill at most half."""
        live = int(np.count_nonzero(self.vals > self.left))
        cap = 1 << max(10, int((live + extra) / 0.5).bit_length())
        keys = np.zeros(cap, dtype=np.int64)
        vals = np.full(cap, -1, dtype=np.int32)
        self.size = int(kernels.future_rehash(self.keys, self.vals, keys, vals, self.left))
        self.keys, self.vals = keys, vals

    def get(self, ids: np.ndarray) -> np.ndarray:
        """The tag of each of ``ids`` (0: never in the horizon)."""
        out = np.empty(ids.shape[0], dtype=np.int32)
        kernels.future_get(self.keys, self.vals, ids, out)
        return out

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.vals.nbytes)

    def clear(self) -> None:
        self.__init__()


class Tier:
    """Rows of one table at one level. ``capacity=None`` means unbounded: it starts with
    ``initial_rows`` slots and doubles when full."""

    def __init__(
        self,
        name: str,
        capacity: int | None,
        width: int,
        device: torch.device,
        policy: str = "hotness",
        decay: float = 0.99,
        initial_rows: int = 1024,
        horizon: bool = False,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown eviction policy '{policy}' (use {', '.join(POLICIES)})")
        self.name = name
        self.bounded = capacity is not None
        self.width = width
        self.device = device
        self.policy = POLICIES[policy]
        self.policy_name = policy
        self.log_decay = float(np.log(decay)) if policy == "hotness" else 0.0
        self.map = IdMap(expected=capacity or initial_rows)
        # the planning horizon: a device tier's only (other tiers keep empty arrays)
        self.horizon = horizon
        self.future = FutureUses()
        self.retired = np.zeros(0, dtype=np.int32)  # free slots taken out of use (resize)
        self._spare: SpareRows | None = None
        self._alloc(capacity or initial_rows)

    def _alloc(self, cap: int) -> None:
        self.slot_ids = np.zeros(cap, dtype=np.int64)
        self.occupied = np.zeros(cap, dtype=np.bool_)
        self.dirty = np.zeros(cap, dtype=np.bool_)
        self.pins = np.zeros(cap, dtype=np.int32)
        # the tag of the latest batch in the horizon that needs the row (``FutureUses``)
        self.wanted = np.zeros(cap if self.horizon else 0, dtype=np.int32)
        self.counts = np.zeros(cap, dtype=np.float32)
        # the step of the last use (int32: 2**31 steps), and the free slots, a stack that pops
        # 0, 1, 2, ... (int32: a tier holds fewer than 2**31 rows); slots leave it as int64
        self.last = np.zeros(cap, dtype=np.int32)
        self.free = np.arange(cap - 1, -1, -1, dtype=np.int32)
        self.n_free = cap
        if self.device.type == "cpu":
            # every slot is written before it is read, so the slab needs no zero fill; its first
            # pages are populated on a background thread (the free slots go out in order), so
            # that rows arriving in the tier do not pay the first touch in the step
            self.slab_np: np.ndarray | None = np.empty((cap, self.width), dtype=np.float32)
            self.slab = torch.from_numpy(self.slab_np)
            if self._spare is not None:
                self._spare.close()
            self._spare = SpareRows(self.slab_np)
            self._spare.first(cap)
        else:
            self.slab_np = None
            self.slab = torch.zeros(cap, self.width, dtype=torch.float32, device=self.device)

    @property
    def capacity(self) -> int:
        return int(self.occupied.shape[0])

    @property
    def size(self) -> int:
        return self.capacity - self.n_free - self.retired.shape[0]

    @property
    def limit(self) -> int:
        """The rows it may hold: its slots less the retired ones."""
        return self.capacity - self.retired.shape[0]

    def _grow(self, need: int, exact: bool = False) -> None:
        old_cap = self.capacity
        cap = old_cap + need if exact else max(2 * old_cap, old_cap + need)
        arrays = (self.slot_ids, self.occupied, self.dirty, self.pins, self.wanted, self.counts,
                  self.last)
        old_slab, old_free = self.slab, self.free[: self.n_free].copy()
        self._alloc(cap)
        for new, old in zip(
            (self.slot_ids, self.occupied, self.dirty, self.pins, self.wanted, self.counts,
             self.last),
            arrays, strict=True,
        ):
            new[:old_cap] = old
        self.slab[:old_cap] = old_slab
        self.free = np.concatenate([np.arange(cap - 1, old_cap - 1, -1, dtype=np.int32), old_free])
        self.n_free = self.free.shape[0]

    # --- lookups and slot management ----------------------------------------------------------
    def lookup(self, ids: np.ndarray) -> np.ndarray:
        return self.map.lookup(ids)

    def lookup_and_pin(self, ids: np.ndarray) -> tuple[np.ndarray, int]:
        """Slots of unique ``ids`` (-1: absent), each present one pinned once; and how many."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        slots = np.empty(ids.shape[0], dtype=np.int64)
        hits = kernels.plan_hits(self.map.keys, self.map.vals, ids, slots, self.pins)
        return slots, int(hits)

    def admit(self, ids: np.ndarray, slots: np.ndarray, counts: np.ndarray, last: np.ndarray,
              dirty: np.ndarray, batch_slots: np.ndarray, now: int, train_dirty: bool) -> None:
        """``put`` absent ``ids`` (rows already written) into allocated ``slots``, pinned once and
        tagged from the horizon, then ``touch`` every one of ``batch_slots`` at ``now`` (and
        mark it dirty when ``train_dirty``): ``kernels.admit``, one pass each."""
        self.map.reserve(ids.shape[0])
        kernels.admit(self.map.keys, self.map.vals, np.ascontiguousarray(ids, dtype=np.int64),
                      slots, counts, last, dirty, self.future.keys, self.future.vals,
                      self.slot_ids, self.occupied, self.dirty, self.pins, self.wanted,
                      self.counts, self.last, batch_slots, now, self.log_decay, train_dirty)
        self.map.size += int(ids.shape[0])

    def alloc(self, n: int) -> np.ndarray:
        """Take ``n`` free slots (growing an unbounded tier)."""
        if n > self.n_free:
            if self.bounded:
                raise RuntimeError(f"{self.name} tier: {n} slots asked, {self.n_free} free")
            self._grow(n - self.n_free)
        slots = self.free[self.n_free - n : self.n_free][::-1].astype(np.int64)
        self.n_free -= n
        return slots

    def put(
        self, ids: np.ndarray, slots: np.ndarray, rows: np.ndarray | torch.Tensor | None,
        counts: np.ndarray, last: np.ndarray, dirty: np.ndarray | bool,
    ) -> None:
        """Place absent ``ids`` with their metadata into allocated ``slots``, and their rows
        unless ``rows`` is None (the caller has written them, e.g. with ``copy_from``)."""
        self.map.insert(ids, slots)
        self.slot_ids[slots] = ids
        self.occupied[slots] = True
        self.dirty[slots] = dirty
        self.pins[slots] = 0
        if self.horizon:
            self.wanted[slots] = 0
        self.counts[slots] = counts
        self.last[slots] = last
        if rows is not None:
            self.write(slots, rows)

    def remove(self, slots: np.ndarray) -> None:
        """Free ``slots`` and forget their IDs."""
        self.map.erase(self.slot_ids[slots])
        self.occupied[slots] = False
        self.dirty[slots] = False
        self.free[self.n_free : self.n_free + slots.shape[0]] = slots[::-1]
        self.n_free += slots.shape[0]

    # --- rows ---------------------------------------------------------------------------------
    def read(self, slots: np.ndarray) -> np.ndarray:
        """Copy of the rows (and state) at ``slots`` as a host array."""
        if self.slab_np is not None:
            out = np.empty((slots.shape[0], self.width), dtype=np.float32)
            kernels.take_rows(self.slab_np, slots, out)
            return out
        return self.slab.index_select(0, torch.from_numpy(slots).to(self.device)).cpu().numpy()

    def write(self, slots: np.ndarray, rows: np.ndarray | torch.Tensor) -> None:
        if self.slab_np is not None:
            src = rows.numpy() if isinstance(rows, torch.Tensor) else rows
            kernels.put_rows(self.slab_np, slots, np.ascontiguousarray(src, dtype=np.float32))
        else:
            src = rows if isinstance(rows, torch.Tensor) else torch.from_numpy(rows)
            self.slab[torch.from_numpy(slots).to(self.device)] = src.to(self.device)

    def copy_from(self, src: Tier, src_slots: np.ndarray, dst_slots: np.ndarray) -> int:
        """Copy rows from another tier's slots into ours; returns the bytes moved."""
        if self.slab_np is not None and src.slab_np is not None:
            kernels.move_rows(src.slab_np, src_slots, self.slab_np, dst_slots)
        else:
            self.write(dst_slots, src.read(src_slots))
        return int(src_slots.shape[0]) * self.width * 4

    # --- eviction -----------------------------------------------------------------------------
    def victims(self, n: int, now: int) -> np.ndarray:
        """Up to ``n`` unpinned slots with the lowest (policy score, slot), rows the horizon
        needs last (``kernels.select_victims``)."""
        out = np.empty(max(n, 0), dtype=np.int64)
        found = kernels.select_victims(
            self.policy, self.occupied, self.pins, self.counts, self.last, now, self.log_decay,
            n, out, self.wanted, self.future.left,
        )
        return out[:found]

    def make_room(
        self, n: int, now: int, evict: Callable[[np.ndarray], None], shrink: Callable[[], bool]
    ) -> bool:
        """Free slots until ``n`` are free: ``evict`` the victims, or ``shrink()`` the pinned
        window when every row is pinned. False when neither helps (the tier is too small)."""
        while n > self.n_free:
            victims = self.victims(n - self.n_free, now)
            if victims.shape[0]:
                evict(victims)
            elif not shrink():
                return False
        return True

    def resize(self, rows: int, now: int, evict: Callable[[np.ndarray], None]) -> None:
        """Hold at most ``rows`` rows from now on (a bounded tier with nothing pinned, between
        batches). Larger: retired slots come back into use first, then the slab grows. Smaller:
        victims leave through ``evict`` (as in ``make_room``) and free slots are retired; the
        slab keeps its size, so a later growth needs no copy."""
        if not self.bounded or rows < 1:
            raise ValueError(f"{self.name} tier: cannot resize to {rows} rows")
        limit = self.limit
        if rows > limit:
            back = min(self.retired.shape[0], rows - limit)
            self._push_free(self.retired[:back])
            self.retired = self.retired[back:]
            if rows > limit + back:
                old = self.n_free
                self._grow(rows - limit - back, exact=True)
                assert self.n_free == old + rows - limit - back
        elif rows < limit:
            n = limit - rows
            if not self.make_room(n, now, evict, lambda: False):
                raise RuntimeError(f"{self.name} tier: {n} rows cannot leave (pinned)")
            taken = self.free[self.n_free - n : self.n_free].copy()
            self.n_free -= n
            self.retired = np.concatenate([self.retired, taken])

    def _push_free(self, slots: np.ndarray) -> None:
        if self.free.shape[0] < self.n_free + slots.shape[0]:
            grown = np.empty(self.n_free + slots.shape[0], dtype=np.int32)
            grown[: self.n_free] = self.free[: self.n_free]
            self.free = grown
        self.free[self.n_free : self.n_free + slots.shape[0]] = slots
        self.n_free += slots.shape[0]

    def touch(self, slots: np.ndarray, now: int) -> None:
        kernels.touch(slots, self.counts, self.last, now, self.log_decay)

    def occupied_slots(self) -> np.ndarray:
        return np.flatnonzero(self.occupied)

    def metadata_nbytes(self) -> dict[str, int]:
        """Bytes of everything the tier keeps beside its slab of rows (and their optimizer
        state), by kind, at the arrays' full capacity: ``id_map`` (the ID->slot map),
        ``slot_maps`` (slot->ID, the free stack, retired slots), ``flags`` (occupied, dirty,
        pins), ``hotness`` (counts, last use) and ``horizon`` (wanted tags, the future-use map)."""
        return {
            "id_map": self.map.nbytes,
            "slot_maps": int(self.slot_ids.nbytes + self.free.nbytes + self.retired.nbytes),
            "flags": int(self.occupied.nbytes + self.dirty.nbytes + self.pins.nbytes),
            "hotness": int(self.counts.nbytes + self.last.nbytes),
            "horizon": int(self.wanted.nbytes + self.future.nbytes),
        }
