"""What the benchmarks measure of a process and how they summarise it: resident memory, CPU
seconds (this process, the machine, a process tree), the engine's source fingerprint, and
medians, percentiles and spreads of per-round figures."""

from __future__ import annotations

import hashlib
import importlib
import os
import resource
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HZ = os.sysconf("SC_CLK_TCK")  # /proc's CPU-time ticks per second

# ------------------------------------------------------------------------- process measurement
def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def process_stats(info: dict[str, Any]) -> dict[str, Any]:
    """A worker's reply to "stats": its peak and current RSS, and ``info`` from its contender."""
    return {"peak_rss_mb": round(peak_rss_mb()), "rss_mb": round(rss_mb()), "info": info}


def cpu_s() -> float:
    """This process's CPU time (user + system), its threads included."""
    t = os.times()
    return t.user + t.system


def busy_s() -> float:
    """CPU seconds the whole machine has been busy (user nice system irq softirq, /proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / HZ


def proc_cpu_s(pid: int) -> float:
    """utime + stime of one process (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / HZ
    except (OSError, IndexError, ValueError):
        return 0.0


def tree_cpu_s(root: int) -> float:
    """CPU seconds of ``root`` and every live descendant, each with its reaped children's
    (utime + stime + cutime + cstime): a process tree's total, data workers that came and went
    and the processes of a fork server included."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            stats[int(entry.name)] = (int(fields[1]), sum(int(x) for x in fields[11:15]) / HZ)
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
            todo.extend(children.get(pid, []))
    return total


def proc_hwm_mb(pid: int) -> float:
    """Peak RSS of one process."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def engine_fingerprint(import_first: Iterable[str] = ()) -> str:
    """Hash of every engine source file (others edit cosparse/ concurrently). A process takes it
    at its start and later on: a file changed in between would make the processes of one run run
    different code. ``import_first``: modules to import before hashing, so that the code this
    process runs later is the code hashed."""
    for m in import_first:
        importlib.import_module(m)
    root = REPO / "cosparse"
    h = hashlib.sha1()
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


# ---------------------------------------------------------------------------------- statistics
def median(xs: Iterable[float]) -> float:
    xs = list(xs)
    return float(statistics.median(xs)) if xs else float("nan")


def pct(xs: Iterable[float], q: float) -> float:
    """The ``q`` quantile, nearest rank."""
    s = sorted(xs)
    return s[int(round(q * (len(s) - 1)))] if s else float("nan")


def spread(xs: list[float]) -> dict[str, Any]:
    """Median, min, max, p25, p75 and the values themselves (rounds)."""
    return {"median": round(median(xs)), "min": round(min(xs)), "max": round(max(xs)),
            "p25": round(pct(xs, 0.25)), "p75": round(pct(xs, 0.75)), "rounds": [round(x) for x in xs]}


def step_ms(step_s: list[float]) -> dict[str, Any]:
    """``step_ms_p50`` and ``step_ms_p10_p90`` of step times in seconds."""
    return {"step_ms_p50": round(1e3 * median(step_s), 1),
            "step_ms_p10_p90": [round(1e3 * pct(step_s, q), 1) for q in (0.1, 0.9)]}


def median_by_key(dicts: list[dict[str, float]], ndigits: int = 2) -> dict[str, float]:
    """Per key (sorted), the median over ``dicts`` (a missing key counts 0)."""
    keys = sorted({k for d in dicts for k in d})
    return {k: round(median(d.get(k, 0.0) for d in dicts), ndigits) for k in keys}
