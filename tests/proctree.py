"""Processes from /proc (no psutil): a process's descendants, and waiting until processes are gone."""

from __future__ import annotations

import os
import signal
import time

from cosparse.owner import start_time


def parents() -> dict[int, int]:
    """pid -> ppid of every live (non-zombie) process."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if fields[0] not in (b"Z", b"X"):
            out[int(name)] = int(fields[1])
    return out


def descendants(pid: int) -> dict[int, int]:
    """Every live descendant of ``pid`` (children, their children...) -> its start time."""
    ppid = parents()
    kids: dict[int, list[int]] = {}
    for p, pp in ppid.items():
        kids.setdefault(pp, []).append(p)
    out: dict[int, int] = {}
    todo = list(kids.get(pid, []))
    while todo:
        p = todo.pop()
        st = start_time(p)
        if st is not None:
            out[p] = st
        todo.extend(kids.get(p, []))
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:120]
    except OSError:
        return "?"


def alive(procs: dict[int, int]) -> dict[int, int]:
    """Those of ``procs`` (pid -> start time) still running (same PID and start time)."""
    return {p: st for p, st in procs.items() if start_time(p) == st}


def wait_gone(procs: dict[int, int], timeout_s: float) -> tuple[float, dict[int, int]]:
    """Wait until every process of ``procs`` has exited; (seconds waited, those still alive)."""
    t0 = time.monotonic()
    left = alive(procs)
    while left and time.monotonic() - t0 < timeout_s:
        time.sleep(0.02)
        left = alive(left)
    return time.monotonic() - t0, left


def kill_all(procs: dict[int, int]) -> None:
    """SIGKILL whatever of ``procs`` still runs (a test's cleanup). multiprocessing's resource
    tracker goes last: it unlinks the run's semaphores once the others are gone."""
    left = alive(procs)
    trackers = {p: st for p, st in left.items() if "resource_tracker" in cmdline(p)}
    _kill({p: st for p, st in left.items() if p not in trackers})
    _kill(wait_gone(trackers, 5.0)[1])  # it exits by itself once its last client is gone


def _kill(procs: dict[int, int]) -> None:
    for p in alive(procs):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
