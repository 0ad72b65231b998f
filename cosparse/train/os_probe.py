"""What the operating system says about this process, cheaply enough to read every step.

- ``run_delay_ms``: the time this process's threads spent runnable but waiting for a CPU (the
  second field of ``/proc/self/task/*/schedstat``, summed over the threads). It grows when other
  processes hold the cores, and it does not grow while a thread waits on I/O or a lock, which is
  what tells "another process on the cores" apart from a slow shard or a slow data worker.
- ``major_faults``: page faults that had to read from disk (memory pressure: the page cache or
  the process's own pages were evicted).
- ``mem_available_mb``: the kernel's estimate of memory available without swapping.
- ``cpu_ms``: the process's CPU time, all threads.

Where ``/proc`` lacks a file (not Linux), the figure is 0.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

_TASKS = Path("/proc/self/task")
_MEMINFO = Path("/proc/meminfo")


def run_delay_ms() -> float:
    """The summed run-queue wait of this process's live threads, in ms."""
    total = 0
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return 0.0
    for tid in tids:
        try:
            with open(_TASKS / tid / "schedstat", "rb") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # (a thread that ended meanwhile)
    return total / 1e6


def mem_available_mb() -> float:
    try:
        with open(_MEMINFO, "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def mem_total_mb() -> float:
    try:
        with open(_MEMINFO, "rb") as f:
            return int(f.readline().split()[1]) / 1024
    except (OSError, IndexError, ValueError):
        return 0.0


class OsProbe:
    """The change of the process's OS figures since the last ``take``."""

    def __init__(self) -> None:
        self._last = self._now()

    @staticmethod
    def _now() -> tuple[float, int, float]:
        return run_delay_ms(), resource.getrusage(resource.RUSAGE_SELF).ru_majflt, \
            time.process_time() * 1e3

    def take(self) -> dict[str, float]:
        now = self._now()
        delay, faults, cpu = (now[i] - self._last[i] for i in range(3))
        self._last = now
        return {"run_delay_ms": max(0.0, delay),  # (threads that ended take theirs away)
                "major_faults": faults, "cpu_ms": cpu, "mem_available_mb": mem_available_mb()}
