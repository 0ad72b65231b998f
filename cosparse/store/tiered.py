"""TieredTable: one table's rows across a bounded device tier, a host tier and an optional tier
below it (the remote PS, or an in-process backing store), with exact write-back.

A row has one authoritative copy: the topmost tier that holds it. A lower copy may exist as a
shadow; a row's dirty bit says the tier below has no identical copy, so a clean victim is simply
dropped and a dirty one is written down. Every move copies bytes and is counted. The optimizer
updates rows in place in the device tier with the same kernels as the all-resident table, so
results are bit-identical to it whatever the capacities, policies and lookahead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import torch

from cosparse.config import TableConfig
from cosparse.store import kernels
from cosparse.store.resident import SlabRows, initial_rows
from cosparse.store.tier import Tier
from cosparse.store.types import CapacityError, DeliveredRowSource, RemoteRows, TableCounters


class TieredTable(SlabRows):
    """Device tier (bounded) over a host tier (bounded or not) over an optional backing store."""

    def __init__(
        self,
        cfg: TableConfig,
        device: torch.device,
        device_rows: int,
        host_rows: int | None,
        spill: bool,
        device_policy: str = "hotness",
        host_policy: str = "lfu",
        decay: float = 0.99,
        ttl_steps: int = 0,
        remote: RemoteRows | None = None,
    ) -> None:
        if host_rows is not None and not spill and host_rows <= 0:
            raise CapacityError(f"table '{cfg.name}': store.host needs rows")
        self._init_layout(cfg, device)
        self.dev = Tier("device", device_rows, self.width, device, device_policy, decay)
        cpu = torch.device("cpu")
        start = 4 * device_rows  # unbounded tiers start here and double
        self.host = Tier("host", host_rows, self.width, cpu, host_policy, decay, start)
        if remote is not None and not spill:
            raise ValueError("a remote tier sits below the host tier: it needs spill")
        # below the host: the remote PS, or an in-process backing store
        self.remote = remote
        self.backing = (
            Tier("backing", None, self.width, cpu, "lfu", decay, start)
            if spill and remote is None else None
        )
        self.counters = TableCounters()
        self.ttl_steps = ttl_steps
        self._unwant_in_plan = False
        self.lock = threading.RLock()
        self._pinned: dict[int, np.ndarray] = {}  # batch sequence -> device slots it pinned

    # --- the same ID and row interface as ResidentTable ---------------------------------------
    def map_ids(self, ids: np.ndarray) -> np.ndarray:
        if self.cfg.hash_size is not None:
            return np.remainder(ids, self.cfg.hash_size)
        return ids

    @property
    def num_rows(self) -> int:
        return self.export()["ids"].shape[0]

    def initial_rows(self, ids: np.ndarray) -> np.ndarray:
        return initial_rows(self.cfg, self.width, ids, serial=True)

    @property
    def slab_array(self) -> np.ndarray | None:
        return self.dev.slab_np

    @property
    def slab(self) -> torch.Tensor:
        return self.dev.slab

    # --- planning one batch -------------------------------------------------------------------
    def plan(self, unique: np.ndarray, seq: int, shrink: Callable[[], bool],
             delivered: DeliveredRowSource | None = None) -> np.ndarray:
        """Make every row of ``unique`` resident on the device and pin it for batch ``seq``.

        Hits stay; misses come from the host, the rows ``delivered`` with the batch, the tier
        below or their initial value; room is
        made by evicting unpinned device rows (dirty ones are written down). When the pinned
        window leaves too little room, ``shrink()`` retires the oldest in-flight batch (False
        when there is none left: the device cannot hold this batch).
        """
        with self.lock:
            if self.ttl_steps and seq % max(1, self.ttl_steps // 4) == 0:
                self._expire(seq - self.ttl_steps)
            dev, c = self.dev, self.counters
            slots = dev.lookup(unique)
            hit = slots >= 0
            kernels.add_pins(slots[hit], dev.pins, 1)
            if self._unwant_in_plan:  # this batch just left the horizon
                kernels.add_pins(slots[hit], dev.wanted, -1)
                self._unwant_in_plan = False
            miss_ids = unique[~hit]
            n_miss = miss_ids.shape[0]
            c.lookups += unique.shape[0]
            c.device_hits += int(hit.sum())
            try:
                room = dev.make_room(n_miss, seq, lambda v: self._evict_device(v, seq),
                                     lambda: self._unlocked(shrink))
            except BaseException:  # cancelled or stalled while shrinking: unpin the hits
                kernels.add_pins(slots[hit], dev.pins, -1)
                raise
            if not room:
                kernels.add_pins(slots[hit], dev.pins, -1)
                raise CapacityError(
                    f"table '{self.cfg.name}': the device tier holds {dev.capacity} rows but "
                    f"one batch needs {unique.shape[0]} unique rows (store.device is too small)"
                )
            if n_miss:
                new_slots = dev.alloc(n_miss)
                self._fill(miss_ids, new_slots, delivered)
                slots[~hit] = new_slots
                kernels.add_pins(new_slots, dev.pins, 1)
            dev.touch(slots, seq)
            dev.dirty[slots] = True  # the batch will train these rows
            self._pinned[seq] = slots
            return slots

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

    def _fill(self, ids: np.ndarray, dst: np.ndarray, delivered: DeliveredRowSource | None = None
              ) -> None:
        """Bring device misses into slots ``dst``: from the host, the delivered rows, the tier
        below, or their initial value (created in place), copying each row once."""
        c, dev = self.counters, self.dev
        n = ids.shape[0]
        counts = np.zeros(n, dtype=np.float32)
        last = np.zeros(n, dtype=np.int64)
        dirty = np.ones(n, dtype=np.bool_)
        hs = self.host.lookup(ids)
        in_host = hs >= 0
        if in_host.any():
            h = hs[in_host]
            c.bytes_host_device += dev.copy_from(self.host, h, dst[in_host])
            counts[in_host] = self.host.counts[h]
            last[in_host] = self.host.last[h]
            dirty[in_host] = False  # the host keeps an identical shadow copy
            c.host_hits += int(in_host.sum())
        rest = np.flatnonzero(~in_host)
        if rest.shape[0] and delivered is not None:
            served, rows = delivered.take(ids[rest])
            if served.any():
                dev.write(dst[rest[served]], rows)
                c.bytes_delivered_device += rows.nbytes
                c.delivered_hits += rows.shape[0]
                rest = rest[~served]
        if rest.shape[0] and self.remote is not None:
            # the PS returns every row: one it has never seen starts from (seed, ID) there
            rows = self.remote.pull(self.cfg.name, ids[rest], with_state=True).rows
            dev.write(dst[rest], rows)
            c.bytes_backing_device += rows.nbytes
            c.backing_hits += rest.shape[0]
            rest = rest[:0]
        if rest.shape[0] and self.backing is not None:
            bs = self.backing.lookup(ids[rest])
            in_b = bs >= 0
            if in_b.any():
                b = bs[in_b]
                c.bytes_backing_device += dev.copy_from(self.backing, b, dst[rest[in_b]])
                counts[rest[in_b]] = self.backing.counts[b]
                last[rest[in_b]] = self.backing.last[b]
                c.backing_hits += int(in_b.sum())
            rest = rest[~in_b]
        if rest.shape[0]:
            c.fresh_rows += rest.shape[0]
            if dev.slab_np is not None:  # created in place
                initial_rows(self.cfg, self.width, ids[rest], serial=True, out=dev.slab_np,
                             slots=dst[rest])
            else:  # created on the host, then copied up
                fresh = self.initial_rows(ids[rest])
                dev.write(dst[rest], fresh)
                c.bytes_host_device += fresh.nbytes
        dev.put(ids, dst, None, counts, last, dirty)
        if dev.future.size:
            dev.wanted[dst] = dev.future.get(ids)

    def _evict_device(self, victims: np.ndarray, seq: int) -> None:
        dev, c = self.dev, self.counters
        ids = dev.slot_ids[victims]
        dirty = dev.dirty[victims]
        hs = self.host.lookup(ids)
        clean = ~dirty
        shadows = hs[clean]  # the host's identical copies of the clean victims
        if clean.any():  # keep the hotness history with them
            self.host.counts[shadows] = dev.counts[victims[clean]]
            self.host.last[shadows] = dev.last[victims[clean]]
        if dirty.any():
            d = victims[dirty]
            c.writebacks_device += d.shape[0]
            # the shadows must survive the room the host makes for the dirty rows
            kernels.add_pins(shadows, self.host.pins, 1)
            try:
                c.bytes_device_host += self._host_put(ids[dirty], hs[dirty], d, seq)
            finally:
                kernels.add_pins(shadows, self.host.pins, -1)
        dev.remove(victims)
        c.evictions_device += victims.shape[0]

    def _host_put(self, ids: np.ndarray, hs: np.ndarray, src: np.ndarray, seq: int) -> int:
        """Write device rows ``src`` (IDs ``ids``, host slots ``hs`` or -1) down to the host:
        overwrite shadow copies, insert the others. Returns the bytes moved."""
        host, dev = self.host, self.dev
        present = hs >= 0
        p = hs[present]
        moved = 0
        if p.shape[0]:
            moved += host.copy_from(dev, src[present], p)
            host.counts[p] = dev.counts[src[present]]
            host.last[p] = dev.last[src[present]]
            host.dirty[p] = True
        new = np.flatnonzero(~present)
        if not new.shape[0]:
            return moved
        kernels.add_pins(p, host.pins, 1)  # rows just written down must not be the victims
        try:
            while host.bounded and new.shape[0] > host.n_free:
                victims = host.victims(new.shape[0] - host.n_free, seq)
                if not victims.shape[0]:
                    raise CapacityError(
                        f"table '{self.cfg.name}': the host tier ({host.capacity} rows) has no "
                        "room for the device's write-back (store.host is too small)"
                    )
                self._evict_host(victims)
        finally:
            kernels.add_pins(p, host.pins, -1)
        slots = host.alloc(new.shape[0])
        moved += host.copy_from(dev, src[new], slots)
        host.put(ids[new], slots, None, dev.counts[src[new]], dev.last[src[new]], True)
        return moved

    def _evict_host(self, victims: np.ndarray) -> None:
        host, c = self.host, self.counters
        ids = host.slot_ids[victims]
        ds = self.dev.lookup(ids)
        on_dev = ds >= 0
        self.dev.dirty[ds[on_dev]] = True  # its shadow is gone: the device copy is the only one
        down = ~on_dev & host.dirty[victims]
        if down.any():
            if self.backing is None and self.remote is None:
                raise CapacityError(
                    f"table '{self.cfg.name}': the host tier ({host.capacity} rows) is full and "
                    "there is no tier below it (set store.host.spill: true or a larger store.host)"
                )
            v = victims[down]
            self._backing_put(ids[down], host.read(v), host.counts[v], host.last[v])
        host.remove(victims)
        c.evictions_host += victims.shape[0]

    def _backing_put(
        self, ids: np.ndarray, rows: np.ndarray, counts: np.ndarray, last: np.ndarray
    ) -> None:
        self.counters.bytes_host_backing += rows.nbytes
        if self.remote is not None:  # written down to the PS (rows with their state)
            self.remote.push_rows(self.cfg.name, ids, np.ascontiguousarray(rows, np.float32))
            return
        b = self.backing
        assert b is not None
        bs = b.lookup(ids)
        present = bs >= 0
        if present.any():
            b.write(bs[present], rows[present])
            b.counts[bs[present]] = counts[present]
            b.last[bs[present]] = last[present]
        new = np.flatnonzero(~present)
        if new.shape[0]:
            slots = b.alloc(new.shape[0])
            b.put(ids[new], slots, rows[new], counts[new], last[new], False)

    def _expire(self, cutoff: int) -> None:
        """TTL: drop from every tier the rows whose authoritative copy was last used before
        ``cutoff`` (pinned rows are in use and never expire)."""
        dev, host, c = self.dev, self.host, self.counters
        on_dev = dev.occupied_slots()
        old_dev = on_dev[(dev.last[on_dev] < cutoff) & (dev.pins[on_dev] == 0)]
        gone = [dev.slot_ids[old_dev]]
        dev.remove(old_dev)
        for tier, above in ((host, (dev,)), (self.backing, (dev, host))):
            if tier is None:
                continue
            occ = tier.occupied_slots()
            ids = tier.slot_ids[occ]
            shadowed = np.zeros(occ.shape[0], dtype=np.bool_)
            for a in above:  # a copy above is authoritative and decides
                shadowed |= a.lookup(ids) >= 0
            expired = ~shadowed & (tier.last[occ] < cutoff)
            gone.append(ids[expired])
            tier.remove(occ[expired])
        dropped = np.unique(np.concatenate(gone))
        for tier in (host, self.backing):  # shadows of dropped rows go too
            if tier is not None:
                s = tier.lookup(dropped)
                tier.remove(s[s >= 0])
        c.ttl_drops += int(dropped.shape[0])

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
            self._unwant_in_plan = False

    def observe_future(self, unique: np.ndarray, delta: int) -> None:
        """A batch enters (+1) or leaves (-1) the planning horizon: its rows are kept on the
        device in preference to rows no batch in the horizon needs.

        A batch leaves the horizon right before it is planned, so the device rows it no longer
        wants are found by that plan's own lookup (no second lookup here)."""
        with self.lock:
            self.dev.future.add(unique, delta)
            if delta > 0:
                s = self.dev.lookup(unique)
                kernels.add_pins(s[s >= 0], self.dev.wanted, delta)
            else:
                self._unwant_in_plan = True

    def resident_ids(self) -> np.ndarray:
        """IDs held by the device or the host tier (what the resident filter publishes)."""
        with self.lock:
            parts = [t.slot_ids[t.occupied_slots()] for t in (self.dev, self.host)]
        return np.concatenate(parts)

    def flush_and_export(self) -> dict[str, np.ndarray]:
        with self.lock:
            self.flush()
            return self.export()

    # --- reads that change nothing: evaluation --------------------------------------------------
    def read_rows(self, unique: np.ndarray) -> torch.Tensor:
        """Rows of ``unique`` from the topmost tier holding them, else their initial value."""
        with self.lock:
            rows = self._lookup_all(unique)
        return torch.from_numpy(rows[:, : self.dim]).to(self.device)

    def _lookup_all(self, ids: np.ndarray) -> np.ndarray:
        rows = np.empty((ids.shape[0], self.width), dtype=np.float32)
        todo = np.arange(ids.shape[0])
        for tier in (self.dev, self.host, self.backing):
            if tier is None or not todo.shape[0]:
                continue
            s = tier.lookup(ids[todo])
            found = s >= 0
            if found.any():
                rows[todo[found]] = tier.read(s[found])
            todo = todo[~found]
        if todo.shape[0] and self.remote is not None:  # read without creating
            rows[todo] = self.remote.pull(self.cfg.name, ids[todo], with_state=True, peek=True).rows
            todo = todo[:0]
        if todo.shape[0]:
            rows[todo] = self.initial_rows(ids[todo])
        return rows

    # --- checkpoints ----------------------------------------------------------------------------
    def flush(self) -> None:
        """Write every dirty, unpinned device row down so the tiers below hold current values."""
        with self.lock:
            dev = self.dev
            d = np.flatnonzero(dev.occupied & dev.dirty & (dev.pins == 0))
            if d.shape[0]:
                ids = dev.slot_ids[d]
                self.counters.bytes_device_host += self._host_put(ids, self.host.lookup(ids), d, 0)
                dev.dirty[d] = False

    def export(self) -> dict[str, np.ndarray]:
        """Every row's authoritative copy (topmost tier), plus the device residency."""
        with self.lock:
            parts = []
            for tier in (self.dev, self.host, self.backing):
                if tier is not None:
                    s = tier.occupied_slots()
                    parts.append((tier.slot_ids[s], tier.read(s)))
            if self.remote is not None:
                parts.append(self.remote.dump(self.cfg.name))
            ids = np.concatenate([p[0] for p in parts])
            rows = np.concatenate([p[1] for p in parts])
            _, first = np.unique(ids, return_index=True)  # topmost copy wins
            device_ids = self.dev.slot_ids[self.dev.occupied_slots()]
            return {"ids": ids[first], "rows": rows[first], "device_ids": device_ids}

    def clear(self) -> None:
        """Drop every row this process holds (a restored PS holds them all)."""
        with self.lock:
            for tier in (self.dev, self.host, self.backing):
                if tier is not None:
                    tier.remove(tier.occupied_slots())
                    tier.pins[:] = 0
            self._pinned.clear()

    def load(self, state: dict[str, np.ndarray]) -> None:
        """Restore rows into the host tier (overflow to the backing store), then the residency."""
        with self.lock:
            ids, rows = state["ids"], state["rows"]
            if rows.shape[1] != self.width:
                raise ValueError(f"table '{self.cfg.name}': checkpoint row width {rows.shape[1]}, "
                                 f"config needs {self.width}")
            self.clear()
            n_host = ids.shape[0] if not self.host.bounded else min(ids.shape[0], self.host.capacity)
            if n_host < ids.shape[0] and self.backing is None and self.remote is None:
                raise CapacityError(f"table '{self.cfg.name}': checkpoint has {ids.shape[0]} rows, "
                                    f"the host tier holds {self.host.capacity} and nothing is below")
            zeros_f, zeros_i = np.zeros(ids.shape[0], np.float32), np.zeros(ids.shape[0], np.int64)
            hs = self.host.alloc(n_host)
            # no tier below holds these rows yet: they are dirty
            self.host.put(ids[:n_host], hs, rows[:n_host], zeros_f[:n_host], zeros_i[:n_host], True)
            if n_host < ids.shape[0]:
                self._backing_put(ids[n_host:], rows[n_host:], zeros_f[n_host:], zeros_i[n_host:])
            dev_ids = state.get("device_ids", np.zeros(0, np.int64))[: self.dev.capacity]
            if dev_ids.shape[0]:
                src = self._lookup_all(dev_ids)
                ds = self.dev.alloc(dev_ids.shape[0])
                on_host = self.host.lookup(dev_ids) >= 0
                self.dev.put(dev_ids, ds, src, np.zeros(dev_ids.shape[0], np.float32),
                             np.zeros(dev_ids.shape[0], np.int64), ~on_host)
