"""Counts of this process's cross-thread and cross-process waits, by site: each time one side
had to block for another (a queue get that found nothing ready, a condition wait, a contended
lock, a request to another process), how often, and how long it was blocked.

The trainer reports them per training step (``final.sync``: ``waits_per_step`` and, per site,
waits and milliseconds blocked). Under CPU contention every hand-off costs a scheduler
wake-up, so their number per step is what a contended host multiplies; the goal is one per batch
per pipeline stage, never one per table or per row.

Written by hand: Python's threading primitives count nothing, and a profiler samples where the
process is, not how many hand-offs a step makes.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass
class _Site:
    waits: int = 0
    blocked_s: float = 0.0


@dataclass
class WaitCounts:
    """A snapshot: per site, (waits, seconds blocked)."""

    sites: dict[str, tuple[int, float]] = field(default_factory=dict)

    def since(self, before: WaitCounts) -> WaitCounts:
        out = {}
        for name, (n, s) in self.sites.items():
            n0, s0 = before.sites.get(name, (0, 0.0))
            if n > n0:
                out[name] = (n - n0, s - s0)
        return WaitCounts(out)

    def per_step(self, steps: int) -> dict[str, object]:
        """``waits_per_step`` (all sites) and ``by_site``: each site's waits and milliseconds
        blocked per step. (A helper thread's wait for work is its idle time, not the step's:
        the milliseconds of different sites do not add up to a step's delay.)"""
        steps = max(steps, 1)
        return {"waits_per_step": sum(n for n, _ in self.sites.values()) / steps,
                "by_site": {name: {"waits": n / steps, "blocked_ms": s * 1e3 / steps}
                            for name, (n, s) in sorted(self.sites.items())}}


_LOCK = threading.Lock()
_SITES: dict[str, _Site] = {}


def record(site: str, blocked_s: float) -> None:
    """One wait at ``site`` that blocked ``blocked_s`` seconds (0 when it found its item ready)."""
    with _LOCK:
        s = _SITES.get(site)
        if s is None:
            s = _SITES[site] = _Site()
        s.waits += 1
        s.blocked_s += blocked_s


def snapshot() -> WaitCounts:
    with _LOCK:
        return WaitCounts({name: (s.waits, s.blocked_s) for name, s in _SITES.items()})


class CountedLock:
    """A re-entrant lock that records, at ``site``, each acquire that found it held by another
    thread (lock contention) and how long that acquire blocked. Uncontended acquires are not
    waits and are not counted."""

    def __init__(self, site: str) -> None:
        self.site = site
        self._lock = threading.RLock()

    def acquire(self) -> bool:
        if self._lock.acquire(blocking=False):
            return True
        t0 = time.perf_counter()
        self._lock.acquire()
        record(self.site, time.perf_counter() - t0)
        return True

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> CountedLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
