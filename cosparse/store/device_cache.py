"""DeviceCache: one table's bounded device tier, planned a batch at a time.

``plan`` finds the hits and pins them for the batch, makes room for the misses (evicting
unpinned rows through the placement's ``_evict``; when the pinned window leaves no room,
``shrink()`` retires the oldest batch in flight, waited for without the table lock) and reserves
their slots. ``fill`` walks the placement's row sources in order until every miss has its row,
then pins the new rows too. Both placements with a device tier are built on it: the tiered table
(host tier and lower tiers beneath, exact write-back) and the ps-cached table (the PS beneath,
written through).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from cosparse.config import TableConfig
from cosparse.store import kernels
from cosparse.store.resident import SlabRows
from cosparse.store.tier import Tier
from cosparse.store.types import BatchPlan, CapacityError, FillTarget, RowSource, TableCounters
from cosparse.waits import CountedLock


class DeviceCache(SlabRows):
    """The device tier of a cached placement; subclasses say how a victim leaves (``_evict``)
    and where a miss comes from (``row_sources``)."""

    pins_rows = True
    write_through = False  # True: the tier below always holds the trained rows (never dirty)
    ttl_steps = 0

    def _init_cache(self, cfg: TableConfig, device: torch.device, rows: int, policy: str,
                    decay: float) -> None:
        self._init_layout(cfg, device)
        self.dev = Tier("device", rows, self.width, device, policy, decay, horizon=True)
        self.counters = TableCounters()
        self.lock = CountedLock("lock.table")  # planner thread vs trainer
        self._pinned: dict[int, np.ndarray] = {}  # batch sequence -> device slots it pinned

    @property
    def slab_array(self) -> np.ndarray | None:
        return self.dev.slab_np

    @property
    def slab(self) -> torch.Tensor:
        return self.dev.slab

    def device_bytes(self) -> tuple[int, int]:
        return self.dev.size * self.row_bytes, self.dev.capacity * self.row_bytes

    def local_tiers(self) -> list[Tier]:
        """The tiers this process holds, topmost first (the PS below is not one of them)."""
        return [self.dev]

    def memory_overhead(self) -> dict[str, int]:
        """What the table keeps beyond its rows and their optimizer state, from the real
        structures' ``nbytes``: every local tier's metadata summed by kind (see
        ``Tier.metadata_nbytes``), ``in_flight`` (the slots pinned by batches in flight), the
        ``total`` and ``live_rows``, the distinct IDs the local tiers hold (a row on two tiers
        counts once). Shadow copies of rows and free slab slots are rows, not counted here."""
        with self.lock:
            tiers = self.local_tiers()
            out: dict[str, int] = {}
            for tier in tiers:
                for kind, n in tier.metadata_nbytes().items():
                    out[kind] = out.get(kind, 0) + n
            out["in_flight"] = sum(int(s.nbytes) for s in self._pinned.values())
            out["total"] = sum(out.values())
            ids = [t.slot_ids[t.occupied_slots()] for t in tiers]
            out["live_rows"] = int(np.unique(np.concatenate(ids)).shape[0])
            return out

    def _evict(self, victims: np.ndarray, seq: int) -> None:
        raise NotImplementedError

    def _expire(self, cutoff: int) -> None:
        raise NotImplementedError

    # --- one batch ------------------------------------------------------------------------------
    def plan(self, unique: np.ndarray, seq: int, shrink: Callable[[], bool]) -> BatchPlan:
        """Pin the hits of ``unique`` for batch ``seq`` and reserve device slots for its misses."""
        with self.lock:
            if self.ttl_steps and seq % max(1, self.ttl_steps // 4) == 0:
                self._expire(seq - self.ttl_steps)
            dev, c = self.dev, self.counters
            slots, n_hits = dev.lookup_and_pin(unique)
            hit = slots >= 0
            miss_ids = unique[~hit]
            c.lookups += unique.shape[0]
            c.device_hits += n_hits
            evicted = c.evictions_device
            try:
                room = dev.make_room(miss_ids.shape[0], seq, lambda v: self._evict(v, seq),
                                     lambda: self._unlocked(shrink))
            except BaseException:  # cancelled or stalled while shrinking: unpin the hits
                kernels.add_pins(slots[hit], dev.pins, -1)
                raise
            if not room:
                kernels.add_pins(slots[hit], dev.pins, -1)
                raise CapacityError(
                    f"table '{self.cfg.name}': the device tier holds {dev.limit} rows but "
                    f"one batch needs {unique.shape[0]} unique rows (store.device is too small)"
                )
            miss_slots = dev.alloc(miss_ids.shape[0]) if miss_ids.shape[0] else miss_ids
            slots[~hit] = miss_slots
            return BatchPlan(slots, hit, miss_ids, miss_slots, c.evictions_device - evicted, seq)

    def _unlocked(self, shrink: Callable[[], bool]) -> bool:
        """Run ``shrink()`` (a wait for the trainer) without the table lock: the trainer may
        need the lock meanwhile (a checkpoint's flush and export), so holding it would deadlock.
        Every step of a plan before this point left the tiers consistent; the hits it has
        pinned stay pinned, so nothing the trainer does can evict them."""
        self.lock.release()
        try:
            return shrink()
        finally:
            self.lock.acquire()

    def fill(self, plan: BatchPlan, sources: list[RowSource]) -> None:
        """Bring the misses' rows in from ``sources`` (in order), then pin the batch's rows."""
        with self.lock:
            dev = self.dev
            target = None
            if plan.miss_ids.shape[0]:
                target = FillTarget.of(dev, plan.miss_ids, plan.miss_slots)
                todo = np.arange(plan.miss_ids.shape[0])
                for source in sources:
                    todo = source.fill(target, todo)
                    if not todo.shape[0]:
                        break
                if target.later is not None:  # the rows come at the end of the plan: so do
                    target.later.after(lambda: self._admit(plan, target))  # map and pins
                    return
            self._admit(plan, target)

    def _admit(self, plan: BatchPlan, target: FillTarget | None) -> None:
        """Map and pin the filled misses of ``plan`` (``target``: their rows' sources' say),
        and record the batch's access to all its rows."""
        with self.lock:
            dev = self.dev
            if target is not None:
                counts, last = target.counts, target.last
                dirty = np.zeros_like(target.dirty) if self.write_through else target.dirty
            else:
                counts = last = plan.miss_ids[:0]
                dirty = np.zeros(0, dtype=np.bool_)
            dev.admit(plan.miss_ids, plan.miss_slots, counts.astype(np.float32, copy=False),
                      last, dirty, plan.slots, plan.seq, not self.write_through)
            self._pinned[plan.seq] = plan.slots

    def release(self, seq: int) -> None:
        """Unpin the rows of batch ``seq`` (it has trained)."""
        with self.lock:
            slots = self._pinned.pop(seq, None)
            if slots is not None:
                kernels.add_pins(slots, self.dev.pins, -1)

    def release_all(self) -> None:
        with self.lock:
            for seq in sorted(self._pinned):
                self.release(seq)
            self.dev.future.clear()
            self.dev.wanted[:] = 0
