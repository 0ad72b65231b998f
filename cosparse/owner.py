"""Who owns a temporary file or directory, and the sweep of what dead owners left behind.

A run names what it may leave behind after a crash (its shared-memory directory, a checkpoint
being written, its temporary directories) with an owner tag, ``own.<node>.<pid>.<start>``:
``node`` stands for this machine and PID namespace (8 hex digits of the boot id and the
namespace), ``pid`` for the owning process and ``start`` for its start time in clock ticks since
boot (``/proc/<pid>/stat``, field 22). The owner is gone when no live process has that PID and
start time: the PID is free, a zombie, or now another process's (a reused PID). An entry whose
tag names another node is never judged, so never removed: a checkpoint directory on shared
storage may belong to a live run elsewhere.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

TAG_RE = re.compile(r"own\.([0-9a-f]{8})\.(\d+)\.(\d+)")
# what earlier versions wrote: ``.tmp-step_NNNNNNNN-<pid>`` (no start time, no node)
_LEGACY_CKPT_RE = re.compile(r"\.tmp-step_\d+-(\d+)$")


@functools.cache
def node_id() -> str:
    """8 hex digits naming this boot of this machine and this PID namespace."""
    try:
        parts = [Path("/proc/sys/kernel/random/boot_id").read_text().strip()]
    except OSError:
        parts = [os.uname().nodename]
    try:
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    except OSError:
        pass
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:8]


def start_time(pid: int) -> int | None:
    """Start time of live process ``pid`` (clock ticks since boot); None when there is no such
    process or it is a zombie (it has exited and only waits to be reaped). Without a /proc
    (not Linux): 0 for any process that exists, so a reused PID is not told apart."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        if os.path.isdir("/proc/self"):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:  # another user's: it exists
            pass
        return 0
    fields = stat[stat.rfind(b")") + 2 :].split()  # after "pid (comm) "
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def owner_tag(pid: int | None = None) -> str:
    """The owner tag of process ``pid`` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    start = start_time(pid)
    if start is None:
        raise ProcessLookupError(f"no live process {pid} to tag")
    return f"own.{node_id()}.{pid}.{start}"


def owner_gone(name: str) -> bool:
    """True when ``name`` carries an owner tag of this node whose process is gone (False for
    a live owner, another node's tag, or no tag)."""
    m = TAG_RE.search(name)
    if m is None or m.group(1) != node_id():
        return False
    return start_time(int(m.group(2))) != int(m.group(3))


def _legacy_gone(path: Path) -> bool:
    """An untagged temporary checkpoint of an earlier version: its PID is free, or the process
    that has it now started after the directory was last written."""
    m = _LEGACY_CKPT_RE.search(path.name)
    if m is None:
        return False
    start = start_time(int(m.group(1)))
    if start is None:
        return True
    try:
        btime = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                     if line.startswith("btime "))
        started = btime + start / os.sysconf("SC_CLK_TCK")
        return path.stat().st_mtime < started - 1.0
    except (OSError, StopIteration, ValueError):
        return False


def sweep(directory: str | Path, prefixes: Iterable[str]) -> list[Path]:
    """Remove the entries of ``directory`` whose name starts with one of ``prefixes`` and whose
    owner is gone; returns what was removed. Entries of live owners, of other nodes, and
    untagged ones are left alone; an entry that vanishes meanwhile (another sweeper) is fine."""
    directory = Path(directory)
    prefixes = tuple(prefixes)
    removed: list[Path] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for e in entries:
        if not e.name.startswith(prefixes):
            continue
        path = Path(e.path)
        if not (owner_gone(e.name) or _legacy_gone(path)):
            continue
        try:
            if e.is_dir(follow_symlinks=False):
                shutil.rmtree(path)
            else:
                path.unlink()
        except FileNotFoundError:
            pass
        except OSError:  # not ours to remove (another user's): leave it
            continue
        removed.append(path)
    return removed
