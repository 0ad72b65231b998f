"""Timed spans of this process that happen off the trainer's own step: PS requests as a client
sees them (op, shard, sent, answered) and work of helper threads (the filter publisher).

The trainer's step records (``cosparse.train.step_records``) take what was recorded since the
last step at each step's end: per-step PS latencies by op and shard, and the spans of a trace.
Recording is off until a trainer turns it on, and bounded (a ring of ``MAX_SPANS``), so a process
nobody reads (a data worker) never grows. Times are ``time.perf_counter()`` seconds, which on
Linux is CLOCK_MONOTONIC, the same clock in every process of the host: spans of different
processes line up on one time axis.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from dataclasses import dataclass

MAX_SPANS = 100_000


@dataclass(frozen=True)
class Span:
    """One timed piece of work: ``name`` on ``track`` (a thread or a PS shard) of ``pid``,
    from ``t0`` to ``t1`` (perf_counter seconds); ``shard`` and ``op`` for a PS request."""

    name: str
    track: str
    t0: float
    t1: float
    pid: int = 0
    shard: int = -1
    op: str = ""


class SpanLog:
    """The process's recorded spans since the last ``take`` (off until ``enable``)."""

    def __init__(self) -> None:
        self.enabled = False
        self._spans: collections.deque[Span] = collections.deque(maxlen=MAX_SPANS)
        self._lock = threading.Lock()

    def enable(self, on: bool = True) -> None:
        self.enabled = on
        if not on:
            self.take()

    def request(self, op: str, shard: int, sent: float, answered: float) -> None:
        """A PS request ``op`` to ``shard``, sent and answered at these perf_counter times."""
        if self.enabled:
            self._spans.append(Span(op, f"ps shard {shard}", sent, answered, os.getpid(),
                                    shard, op))

    def work(self, name: str, t0: float, t1: float | None = None) -> None:
        """``name`` done on the calling thread from ``t0`` to ``t1`` (default: now)."""
        if self.enabled:
            self._spans.append(Span(name, threading.current_thread().name, t0,
                                    time.perf_counter() if t1 is None else t1, os.getpid()))

    def take(self) -> list[Span]:
        """Every span recorded since the last call, oldest first."""
        with self._lock:  # (appends go on meanwhile: only what was there is taken)
            return [self._spans.popleft() for _ in range(len(self._spans))]


SPANS = SpanLog()
