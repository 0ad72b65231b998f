"""TieredTable: one table's rows across a bounded device tier, a host tier and an optional tier
below it (the remote PS, or an in-process backing store), with exact write-back.

A row has one authoritative copy: the topmost tier that holds it. A lower copy may exist as a
shadow; a row's dirty bit says the tier below has no identical copy, so a clean victim is simply
dropped and a dirty one is written down. Every move copies bytes and is counted. The optimizer
updates rows in place in the device tier with the same kernels as the all-resident table, so
results are bit-identical to it whatever the capacities, policies and lookahead.
"""

from __future__ import annotations

import numpy as np
import torch

from cosparse.config import TableConfig
from cosparse.store import kernels
from cosparse.store.dedup import row_owner
from cosparse.store.device_cache import DeviceCache
from cosparse.store.remote_batch import RemoteBatch
from cosparse.store.resident import initial_rows
from cosparse.store.sources import (
    BackingSource,
    DeliveredSource,
    FreshSource,
    HostSource,
    RemoteSource,
)
from cosparse.store.tier import Tier
from cosparse.store.types import CapacityError, DeliveredRowSource, RemoteRows, RowSource


class TieredTable(DeviceCache):
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
        self._init_cache(cfg, device, device_rows, device_policy, decay)
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
        self.ttl_steps = ttl_steps

    @property
    def ps_backed(self) -> bool:
        return self.remote is not None

    def drop_local_rows(self) -> None:
        self.clear()

    @property
    def num_rows(self) -> int:
        return self.export()["ids"].shape[0]

    def initial_rows(self, ids: np.ndarray) -> np.ndarray:
        return initial_rows(self.cfg, self.width, ids, serial=True)

    # --- where a device miss comes from, where a victim goes -----------------------------------
    def row_sources(self, delivered: DeliveredRowSource | None = None) -> list[RowSource]:
        """The host tier, the rows ``delivered`` with the batch, the tier below (the PS or the
        in-process store), then the initial value."""
        c = self.counters
        sources: list[RowSource] = [HostSource(self.host, c)]
        if delivered is not None:
            sources.append(DeliveredSource(delivered, c))
        if self.remote is not None:
            sources.append(RemoteSource(self.remote, self.cfg.remote_name, c))
        if self.backing is not None:
            sources.append(BackingSource(self.backing, c))
        sources.append(FreshSource(self.cfg, self.width, c))
        return sources

    def _evict(self, victims: np.ndarray, seq: int) -> None:
        self._evict_device(victims, seq)

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

    def resize(self, device_rows: int | None, host_rows: int | None, seq: int) -> None:
        """New tier capacities between batches (nothing pinned; None: unchanged). Rows move
        down as on any eviction, so what the table holds is unchanged; the host tier stays at
        least as large as the device's."""
        with self.lock:
            dev_to = self.dev.limit if device_rows is None else device_rows
            host_to = host_rows if host_rows is not None else (
                self.host.limit if self.host.bounded else None)
            if host_to is not None and host_to < dev_to:
                raise CapacityError(f"table '{self.cfg.name}': {host_to} host rows cannot hold "
                                    f"the device tier's {dev_to}")
            if host_rows is not None and host_rows > self.host.limit:
                self.host.resize(host_rows, seq, self._evict_host)  # room first, then below
            if device_rows is not None:
                self.dev.resize(device_rows, seq, lambda v: self._evict_device(v, seq))
            if host_rows is not None and host_rows < self.host.limit:
                self.host.resize(host_rows, seq, self._evict_host)

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
            self.remote.push_rows(self.cfg.remote_name, ids, np.ascontiguousarray(rows, np.float32))
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

    def observe_future(self, unique: np.ndarray, delta: int) -> None:
        """A batch enters (+1) or leaves (-1) the planning horizon: its rows are kept on the
        device in preference to rows no batch in the horizon needs. Entering tags its IDs (and
        their device rows); leaving only counts (``FutureUses``)."""
        with self.lock:
            if delta > 0:
                self.dev.future.enter(np.ascontiguousarray(unique, dtype=np.int64),
                                      self.dev.map, self.dev.wanted)
            else:
                self.dev.future.leave()

    def local_tiers(self) -> list[Tier]:
        return [t for t in (self.dev, self.host, self.backing) if t is not None]

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
        queued = self._queued_down() if todo.shape[0] and self.remote is not None else None
        if queued is not None:  # written back by a plan under way, not yet on the PS
            at = np.searchsorted(queued[0], ids[todo])
            found = queued[0][np.minimum(at, queued[0].shape[0] - 1)] == ids[todo]
            rows[todo[found]] = queued[1][at[found]]
            todo = todo[~found]
        if todo.shape[0] and self.remote is not None:  # read without creating
            rows[todo] = self.remote.pull(self.cfg.remote_name, ids[todo], with_state=True, peek=True).rows
            todo = todo[:0]
        if todo.shape[0]:
            rows[todo] = self.initial_rows(ids[todo])
        return rows

    def _queued_down(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Rows this table wrote back during a plan under way that the PS has not acknowledged
        (``RemoteBatch.pending``; IDs sorted), else None."""
        if not isinstance(self.remote, RemoteBatch):
            return None
        return self.remote.pending(self.cfg.remote_name)

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
                queued = self._queued_down()
                if queued is not None:  # (in flight to the PS: newer than its copy)
                    parts.append(queued)
                parts.append(self.remote.dump(self.cfg.remote_name))
            ids = np.concatenate([p[0] for p in parts])
            rows = np.concatenate([p[1] for p in parts])
            _, first = np.unique(ids, return_index=True)  # topmost copy wins
            if self.cfg.rows_of:  # a row-wise shard over a shared PS: the rows it owns
                shard, shards = self.cfg.rows_of
                first = first[row_owner(ids[first], shards) == shard]
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
