"""Host CPU and memory use of a run: this process and its descendants (the data workers), read
from ``/proc`` by a sampling thread. Processes named in ``exclude`` (embedded PS shards, which
stand in for remote machines) and their descendants are left out."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _stat(pid: int) -> tuple[int, float, int] | None:
    """(parent pid, CPU seconds, RSS bytes) of ``pid``; None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    ppid, utime, stime, rss = int(fields[1]), int(fields[11]), int(fields[12]), int(fields[21])
    return ppid, (utime + stime) / _TICK, rss * _PAGE


def _tree(root: int, exclude: set[int]) -> dict[int, tuple[float, int]]:
    """CPU seconds and RSS of ``root`` and every descendant not under ``exclude``."""
    stats: dict[int, tuple[int, float, int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None:
                stats[int(entry.name)] = st
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in exclude or pid not in stats:
            continue
        out[pid] = stats[pid][1:]
        todo.extend(children.get(pid, []))
    return out


def total_memory_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class HostUsage:
    """Samples every ``interval_s`` between ``start`` and ``stop``; ``stop`` returns
    ``cpu_util`` (busy cores on average), ``cpu_count``, ``rss_bytes`` (peak) and
    ``mem_total_bytes``."""

    def __init__(self, exclude: set[int] | None = None, interval_s: float = 0.25) -> None:
        self.exclude = set(exclude or ())
        self.interval_s = interval_s
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._peak_rss = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def _sample(self) -> None:
        tree = _tree(os.getpid(), self.exclude)
        for pid, (cpu, _) in tree.items():
            self._first.setdefault(pid, cpu if pid in self._seen_at_start else 0.0)
            self._last[pid] = cpu
        self._peak_rss = max(self._peak_rss, sum(rss for _, rss in tree.values()))

    def start(self) -> HostUsage:
        self._seen_at_start = set(_tree(os.getpid(), self.exclude))
        self._t0 = time.monotonic()
        self._sample()
        self._thread = threading.Thread(target=self._run, name="cosparse-host-usage", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def stop(self) -> dict[str, float]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        wall = max(time.monotonic() - self._t0, 1e-9)
        cpu = sum(self._last[p] - self._first[p] for p in self._last)
        return {"cpu_util": cpu / wall, "cpu_count": os.cpu_count() or 1,
                "rss_bytes": self._peak_rss, "mem_total_bytes": total_memory_bytes()}
