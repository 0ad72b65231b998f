"""The trainer side of the collaborative supply.

Per batch, ``sources`` wraps each table's delivered rows in a ``DeliveredSource``; the tiered
table asks it for the rows of its device misses that the host tier does not hold. A delivered
row is used only when no write-back of it happened after the worker's pull (the write-back log
against the shard write counter the pull saw); otherwise it is a stale drop and the trainer
fetches the row itself. ``settle`` counts the rest as wasted (the trainer already held them).

A publisher thread rebuilds the resident filter every ``publish_every`` steps from the device
and host tiers; ``health`` reports a publisher that has not served a request in
``publish_timeout_s``, and a stale-drop rate above ``max_stale_rate``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Protocol

import numpy as np

from cosparse import waits
from cosparse.ps.protocol import shard_of
from cosparse.spans import SPANS
from cosparse.supply.collaborative.resident_filter import FilterBoard, FilterLayout
from cosparse.supply.collaborative.types import DeliveredRows, Delivery, SupplyCounters
from cosparse.supply.collaborative.writeback_log import LoggedRemote, WriteBackLog

_STALE_WINDOW_ROWS = 2000  # delivered rows per stale-rate check


class SupplyFailure(RuntimeError):
    """The collaborative path failed at run time (the trainer may fall back to ps-direct)."""


class ResidentTiers(Protocol):
    def resident_ids(self) -> np.ndarray: ...


class DeliveredSource:
    """One table's delivered rows for one batch, checked against the table's write-back log."""

    def __init__(self, rows: DeliveredRows, log: WriteBackLog, num_shards: int) -> None:
        self.rows = rows
        self.log = log
        self.num_shards = num_shards
        self.used = 0
        self.stale = 0

    def take(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mask over ``ids`` of the rows served, those rows [mask.sum(), width])."""
        d = self.rows
        if not d.ids.shape[0] or not ids.shape[0]:
            return np.zeros(ids.shape[0], dtype=np.bool_), d.rows[:0]
        pos = np.minimum(np.searchsorted(d.ids, ids), d.ids.shape[0] - 1)
        found = d.ids[pos] == ids
        f_ids, f_pos = ids[found], pos[found]
        pulled_at = d.counters[shard_of(f_ids, self.num_shards)]
        fresh = self.log.last(f_ids) <= pulled_at
        self.used += int(fresh.sum())
        self.stale += int(f_ids.shape[0] - fresh.sum())
        use = found.copy()
        use[found] = fresh
        return use, d.rows[f_pos[fresh]]


class CollaborativeSupply:
    """Delivered-row bookkeeping and the resident-filter publisher of one trainer."""

    def __init__(
        self,
        tables: Mapping[str, ResidentTiers],
        remote: LoggedRemote,
        layout: FilterLayout,
        publish_every: int = 1,
        publish_timeout_s: float = 30.0,
        max_stale_rate: float = 0.5,
        counters: SupplyCounters | None = None,
        remote_names: Mapping[str, str] | None = None,
    ) -> None:
        self.tables = {name: tables[name] for name in layout.tables}
        self.remote = remote
        # each table's name on the PS, where its write-backs are logged (a column shard's own)
        self.remote_names = dict(remote_names or {})
        self.board = FilterBoard(layout)
        self.publish_every = max(1, publish_every)
        self.publish_timeout_s = publish_timeout_s
        self.max_stale_rate = max_stale_rate
        self.counters = counters if counters is not None else SupplyCounters()
        self._stale_window = (self.counters.delivered_rows, self.counters.stale_drops)
        self._cond = threading.Condition()
        self._requested: int | None = None  # step of the pending publish request
        self._requested_at = 0.0
        self._stop = False
        self._error: BaseException | None = None
        self.publish(0)  # an empty filter first: workers bring every row until the next one
        self._thread = threading.Thread(target=self._run, name="cosparse-filter", daemon=True)
        self._thread.start()

    # --- per batch ----------------------------------------------------------------------------
    def sources(self, delivery: Delivery | None) -> dict[str, DeliveredSource] | None:
        if delivery is None:
            return None
        self.counters.batches += 1
        self.counters.worker_ps_bytes += delivery.worker_ps_bytes
        out = {}
        n = self.remote.client.num_shards
        for name, rows in delivery.rows.items():
            self.counters.delivered_rows += rows.ids.shape[0]
            self.counters.delivered_bytes += rows.nbytes
            out[name] = DeliveredSource(rows, self.remote.log(self.remote_names.get(name, name)), n)
        return out

    def settle(self, sources: Mapping[str, DeliveredSource]) -> None:
        """After planning: delivered rows neither used nor stale were already held."""
        c = self.counters
        for s in sources.values():
            wasted = s.rows.ids.shape[0] - s.used - s.stale
            row_bytes = s.rows.rows.shape[1] * s.rows.rows.itemsize
            c.used_rows += s.used
            c.stale_drops += s.stale
            c.wasted_rows += wasted
            c.wasted_bytes += wasted * row_bytes

    # --- the resident filter ------------------------------------------------------------------
    def publish(self, step: int) -> None:
        """Build and publish the filter now (on the caller's thread)."""
        t0 = time.perf_counter()
        resident = {name: t.resident_ids() for name, t in self.tables.items()}
        self.board.publish(resident, step)
        self.counters.publishes += 1
        SPANS.work(f"publish filter (step {step})", t0)

    def on_step(self, step: int) -> None:
        """The trainer finished ``step``: every ``publish_every`` steps, ask for a new filter."""
        if step % self.publish_every:
            return
        with self._cond:
            if self._requested is None:
                self._requested_at = time.monotonic()
            self._requested = step
            self._cond.notify()

    def health(self) -> str | None:
        """Why the collaborative path cannot go on (None while it is healthy)."""
        if self._error is not None:
            return f"the resident-filter publisher failed: {self._error!r}"
        c = self.counters
        delivered = c.delivered_rows - self._stale_window[0]
        if delivered >= _STALE_WINDOW_ROWS:
            stale = c.stale_drops - self._stale_window[1]
            self._stale_window = (c.delivered_rows, c.stale_drops)
            if stale > self.max_stale_rate * delivered:
                return (f"{stale} of the last {delivered} delivered rows were stale (rate "
                        f"{stale / delivered:.2f} > supply.max_stale_rate {self.max_stale_rate:g})")
        with self._cond:
            if self._requested is None:
                return None
            waited = time.monotonic() - self._requested_at
        if waited > self.publish_timeout_s:
            return (f"the resident-filter publisher stalled: no filter for {waited:.1f} s "
                    f"(supply.publish_timeout_s {self.publish_timeout_s:g})")
        return None

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._requested is None and not self._stop:
                    t0 = time.perf_counter()
                    while self._requested is None and not self._stop:
                        self._cond.wait()
                    waits.record("publisher<-trainer", time.perf_counter() - t0)
                if self._stop:
                    return
                step = self._requested
            try:
                self.publish(step)
            except BaseException as e:  # noqa: BLE001 - reported by health()
                self._error = e
                return
            with self._cond:
                if self._requested == step:
                    self._requested = None
                else:  # a newer request came in while this one was built
                    self._requested_at = time.monotonic()

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=5.0)
        self.board.close()
