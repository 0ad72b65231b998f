"""Row sources: where a device miss comes from, walked in order by a cached placement's ``fill``.

Each source writes the rows it holds straight into their device slots (tier to tier where both
are host memory: one copy), sets their hotness and dirty bit, counts them, and hands on the rest:

- ``HostSource``: the host tier (a clean copy: the host keeps an identical shadow);
- ``DeliveredSource``: rows a data worker brought with the batch (architecture B);
- ``RemoteSource``: the PS (rows with their optimizer state; serves every ID, creating unknown
  ones there); ``clean`` when the PS copy stays identical (a write-through cache);
- ``BackingSource``: the in-process spill store below the host;
- ``FreshSource``: the row's initial value, a pure function of (table seed, ID).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cosparse.config import TableConfig
from cosparse.store.remote_batch import RemoteBatch
from cosparse.store.resident import initial_rows
from cosparse.store.tier import Tier
from cosparse.store.types import DeliveredRowSource, FillTarget, RemoteRows, TableCounters


class HostSource:
    def __init__(self, host: Tier, counters: TableCounters) -> None:
        self.host, self.counters = host, counters

    def fill(self, target: FillTarget, todo: np.ndarray) -> np.ndarray:
        hs = self.host.lookup(target.ids[todo])
        found = hs >= 0
        if found.any():
            h, at = hs[found], todo[found]
            self.counters.bytes_host_device += target.tier.copy_from(self.host, h, target.slots[at])
            target.counts[at] = self.host.counts[h]
            target.last[at] = self.host.last[h]
            target.dirty[at] = False  # the host keeps an identical shadow copy
            self.counters.host_hits += int(found.sum())
        return todo[~found]


class DeliveredSource:
    def __init__(self, delivered: DeliveredRowSource, counters: TableCounters) -> None:
        self.delivered, self.counters = delivered, counters

    def fill(self, target: FillTarget, todo: np.ndarray) -> np.ndarray:
        served, rows = self.delivered.take(target.ids[todo])
        if served.any():
            target.tier.write(target.slots[todo[served]], rows)
            self.counters.bytes_delivered_device += rows.nbytes
            self.counters.delivered_hits += rows.shape[0]
        return todo[~served]


class RemoteSource:
    """The PS: one pull of every ID asked (an ID it has never seen starts from (seed, ID))."""

    def __init__(self, remote: RemoteRows, table: str, counters: TableCounters,
                 clean: bool = False, versions: np.ndarray | None = None) -> None:
        self.remote, self.table, self.counters = remote, table, counters
        self.clean = clean  # the PS copy stays identical (write-through): the row is not dirty
        self.versions = versions  # per device slot: the PS version of the copy read

    def fill(self, target: FillTarget, todo: np.ndarray) -> np.ndarray:
        if not todo.shape[0]:
            return todo
        if self.clean:
            target.dirty[todo] = False
        slots = target.slots[todo]

        def write(got: Any) -> None:
            target.tier.write(slots, got.rows)
            if self.versions is not None:
                self.versions[slots] = got.versions
            self.counters.bytes_backing_device += got.rows.nbytes

        self.counters.backing_hits += todo.shape[0]
        ids = target.ids[todo]
        if isinstance(self.remote, RemoteBatch) and self.remote.pull_later(self.table, ids, write):
            target.later = self.remote  # with every other table's, at the end of the plan
        else:
            write(self.remote.pull(self.table, ids, with_state=True))
        return todo[:0]


class BackingSource:
    def __init__(self, backing: Tier, counters: TableCounters) -> None:
        self.backing, self.counters = backing, counters

    def fill(self, target: FillTarget, todo: np.ndarray) -> np.ndarray:
        bs = self.backing.lookup(target.ids[todo])
        found = bs >= 0
        if found.any():
            b, at = bs[found], todo[found]
            self.counters.bytes_backing_device += target.tier.copy_from(self.backing, b,
                                                                        target.slots[at])
            target.counts[at] = self.backing.counts[b]
            target.last[at] = self.backing.last[b]
            self.counters.backing_hits += int(found.sum())
        return todo[~found]


class FreshSource:
    """Initial values, created in place on a host-memory device tier (copied up otherwise)."""

    def __init__(self, cfg: TableConfig, width: int, counters: TableCounters) -> None:
        self.cfg, self.width, self.counters = cfg, width, counters

    def fill(self, target: FillTarget, todo: np.ndarray) -> np.ndarray:
        if not todo.shape[0]:
            return todo
        self.counters.fresh_rows += todo.shape[0]
        dev, ids = target.tier, target.ids[todo]
        if dev.slab_np is not None:
            initial_rows(self.cfg, self.width, ids, serial=True, out=dev.slab_np,
                         slots=target.slots[todo])
        else:
            fresh = initial_rows(self.cfg, self.width, ids, serial=True)
            dev.write(target.slots[todo], fresh)
            self.counters.bytes_host_device += fresh.nbytes
        return todo[:0]
