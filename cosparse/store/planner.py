"""CachePlanner: plans batches in order, ``lookahead`` batches ahead of the trainer.

Planning batch p makes its rows resident on the device and pins them. The rows of batches
p-k .. p (the window) stay pinned, so a row fetched ahead can never be evicted before its batch
trains. Before planning p the planner waits until batch p-k-1 has trained and releases its pins:
the release points depend only on the data, so planning is deterministic. When the pinned window
leaves no room, the planner waits for the oldest batch in flight, releases it and retries (a
*lookahead shrink*, counted); the run goes on, only slower.

The planner waits for the trainer, so a table never calls ``shrink()`` while holding a lock the
trainer needs (see ``TieredTable.plan``). Every wait is bounded by the trainer's ``Progress``:
a trainer that keeps training (or checkpointing, or evaluating) is progress; one silent for
``stall_timeout_s`` raises ``StallError`` naming both sides.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

import numpy as np

from cosparse import waits
from cosparse.stall import Progress
from cosparse.store.remote_batch import RemoteBatch
from cosparse.store.types import BatchPlan, DeliveredRowSource, TablePlacement


class PlannerCancelled(Exception):
    """The trainer stopped while the planner waited for it."""


class CachePlanner:
    def __init__(self, tables: Mapping[str, TablePlacement], lookahead: int, windowed: bool = True):
        self.tables = tables
        # all-resident tables pin nothing, so their batches need not wait for each other
        self.windowed = windowed
        self.lookahead = lookahead if windowed else 1 << 62
        self._cond = threading.Condition()
        self._done = 0  # batches trained (their optimizer step applied)
        self._next = 0  # sequence number of the next batch to plan
        self._released = 0  # batches whose pins are released
        self._cancelled = False
        self.shrinks = 0
        self._trainer: Progress | None = None
        self._stall_timeout_s = 0.0
        # the PS beneath the tiers, batched per plan (one round trip per kind for all tables)
        self._remotes = list({id(r): r for r in (getattr(t, "remote", None) for t in tables.values())
                              if isinstance(r, RemoteBatch)}.values())

    def watch(self, trainer: Progress, stall_timeout_s: float) -> None:
        """Bound every wait for the trainer: raise ``StallError`` when ``trainer`` makes no
        progress for ``stall_timeout_s`` (0: wait without bound)."""
        self._trainer = trainer
        self._stall_timeout_s = stall_timeout_s

    def set_lookahead(self, lookahead: int) -> None:
        """Plan this many batches ahead from now on (between runs of the stream: nothing in
        flight); all-resident tables stay unbounded."""
        if self.windowed:
            self.lookahead = lookahead

    def reset(self, seq: int) -> None:
        """Forget batches in flight (after a stop) and continue from batch ``seq``."""
        for t in self.tables.values():
            t.release_all()
        with self._cond:
            self._done = self._next = self._released = seq
            self._cancelled = False

    def cancel(self) -> None:
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()

    def mark_done(self) -> None:
        """The trainer finished the oldest batch in flight."""
        with self._cond:
            self._done += 1
            self._cond.notify_all()

    def _wait_done(self, n: int, blocking: bool) -> None:
        t0 = time.monotonic()
        with self._cond:
            if self._done >= n:
                return
            try:
                self._wait_locked(n, blocking, t0)
            finally:
                waits.record("planner<-trainer", time.monotonic() - t0)

    def _wait_locked(self, n: int, blocking: bool, t0: float) -> None:
        """Wait (holding ``_cond``) until the trainer has finished ``n`` batches."""
        while self._done < n:
            if not blocking:
                raise RuntimeError(
                    "planning a training batch before the previous one applied its gradients "
                    "(call apply_gradients() after backward)"
                )
            if self._cancelled:
                raise PlannerCancelled()
            self._cond.wait(timeout=0.1)
            if self._trainer is not None and self._done < n:
                self._trainer.check(
                    "the cache planner (prefetch thread)",
                    f"batch {n - 1} to train, to release its pinned rows",
                    t0, self._stall_timeout_s,
                )

    def _release_through(self, n: int) -> None:
        while self._released < n:
            for t in self.tables.values():
                t.release(self._released)
            self._released += 1

    def plan(self, uniques: Mapping[str, np.ndarray], blocking: bool = True,
             delivered: Mapping[str, DeliveredRowSource] | None = None) -> dict[str, BatchPlan]:
        """Each table's plan for the unique IDs of the next batch, its misses filled from the
        table's row sources (``delivered``: rows that came with the batch, per table).

        ``blocking=False`` (planning inline, on the trainer's thread) raises instead of waiting.
        """
        p = self._next
        first = max(0, p - self.lookahead)
        self._wait_done(first, blocking)
        self._release_through(first)

        def shrink() -> bool:
            if self._released >= p:
                return False
            self._wait_done(self._released + 1, blocking)
            self._release_through(self._released + 1)
            self.shrinks += 1
            return True

        delivered = delivered or {}
        out = {}
        for r in self._remotes:
            r.begin()
        try:
            for name, u in uniques.items():
                table = self.tables[name]
                plan = table.plan(u, p, shrink)
                t0 = time.perf_counter()
                table.fill(plan, table.row_sources(delivered.get(name)))
                plan.fill_ms = (time.perf_counter() - t0) * 1e3
                out[name] = plan
        finally:  # (also when a table failed: the tables before it finish their fill)
            t0 = time.perf_counter()
            for r in self._remotes:
                r.flush()
        if out and self._remotes:  # the batched PS round trips count as the tables' fill
            share = (time.perf_counter() - t0) * 1e3 / len(out)
            for plan in out.values():
                plan.fill_ms += share
        self._next += 1
        return out
