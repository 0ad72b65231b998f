"""Simulated network links: one shared FIFO token bucket per link, plus a fixed latency.

A link carries every byte of every socket on it, so B's workers cannot get free bandwidth by
opening more connections: the trainer host's link (all trainer<->PS traffic), each worker node's
link to the PS and the worker->trainer sample link are each one ``LinkShaper``. A transfer of
``n`` bytes that starts at ``t`` finishes at ``max(t, link free) + n / rate`` (+ the latency per
message); the caller sleeps until then. ``LinkSpec`` is the picklable description a worker gets.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class LinkSpec:
    mbps: float | None = None  # None: unlimited bandwidth
    latency_ms: float = 0.0  # one way, per message

    @property
    def shaped(self) -> bool:
        return self.mbps is not None or self.latency_ms > 0

    def shaper(self) -> LinkShaper | None:
        return LinkShaper(self.mbps, self.latency_ms) if self.shaped else None


class LinkShaper:
    """One link's bandwidth and latency; thread-safe (every socket of the link shares it)."""

    def __init__(self, mbps: float | None, latency_ms: float = 0.0) -> None:
        if mbps is not None and mbps <= 0:
            raise ValueError("link bandwidth must be positive (Mbit/s)")
        if latency_ms < 0:
            raise ValueError("link latency must be >= 0 ms")
        self.bytes_per_s = None if mbps is None else mbps * 1e6 / 8
        self.latency_s = latency_ms / 1e3
        self._lock = threading.Lock()
        self._free_at = 0.0  # wall-clock time the link finishes what it has been given
        self.bytes = 0
        self.waited_s = 0.0

    def transfer(self, nbytes: int, messages: int = 1, started: float | None = None) -> float:
        """Account ``nbytes`` in ``messages`` messages that entered the link at ``started``
        (wall clock, default now) and sleep until they are through; returns the seconds slept."""
        now = time.time()
        start = now if started is None else min(started, now)
        with self._lock:
            begin = max(start, self._free_at)
            serial = 0.0 if self.bytes_per_s is None else nbytes / self.bytes_per_s
            self._free_at = begin + serial
            done = self._free_at + messages * self.latency_s
            self.bytes += nbytes
        wait = done - time.time()
        if wait > 0:
            time.sleep(wait)
            self.waited_s += wait
            return wait
        return 0.0


@dataclass
class Links:
    """The simulated links of one run: the trainer host's link to the PS, each worker node's
    link to the PS (a spec: every worker process builds its own), and the worker->trainer link."""

    trainer_ps: LinkShaper | None = None
    worker_ps: LinkSpec | None = None
    worker_trainer: LinkShaper | None = None

    @classmethod
    def from_config(cls, network: object) -> Links:
        spec = LinkSpec(getattr(network, "link_mbps", None), getattr(network, "link_latency_ms", 0.0))
        if not spec.shaped:
            return cls()
        return cls(spec.shaper(), spec, spec.shaper())
