"""PS snapshots on disk, outside a shard's request loop: pruning with the trainer's ``keep``,
and what an earlier run left in an embedded data dir (defect 6: refused, or discarded on
``--fresh``).

A shard's snapshots live in ``<root>/snapshots/<NNNNNNNN>-<full|incr>``; an incremental one names
its parent, so keeping it keeps its whole chain down to a full one. ``prune`` keeps the
snapshots it is told to (those the trainer's kept checkpoints name) and what ``LATEST`` names,
each with its chain, and removes the others. An embedded data dir holds one root per shard,
``<data_dir>/shard-<i>``.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable
from pathlib import Path

from cosparse.config import ConfigError
from cosparse.owner import owner_tag, sweep
from cosparse.ps.snapshot_format import SnapshotError, read_latest, walk_chain

SNAPSHOT_RE = re.compile(r"^\d{8}-(full|incr)$")


class StaleSnapshots(ConfigError):
    """A run that starts at step 0 would train on an earlier run's PS rows."""


def chain(root: str | Path, name: str) -> list[str]:
    """``name`` and the snapshots it depends on, newest first (ends with a full one); a chain
    that loops or is too long is a ``SnapshotError`` (``walk_chain``)."""
    return [n for n, _ in walk_chain(root, name)]


def prune(root: str | Path, keep: Iterable[str]) -> list[str]:
    """Remove the snapshots of ``root`` that neither ``keep`` nor ``LATEST`` needs; returns the
    names removed. A snapshot that a kept incremental one depends on is never removed; when a
    needed chain cannot be read, nothing is."""
    root = Path(root)
    snaps = root / "snapshots"
    sweep(snaps, [".tmp-"])
    try:
        latest = read_latest(root)
        needed: set[str] = set()
        for name in {*keep, *([latest] if latest else [])}:
            if (snaps / name).is_dir():
                needed.update(chain(root, name))
    except SnapshotError:
        return []
    removed = []
    tag = owner_tag()
    for d in sorted(snaps.iterdir()) if snaps.is_dir() else []:
        if not SNAPSHOT_RE.match(d.name) or d.name in needed:
            continue
        doomed = snaps / f".tmp-del-{d.name}-{tag}"  # a removal cut short is swept later
        d.rename(doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        removed.append(d.name)
    return removed


def shard_roots(data_dir: str | Path) -> list[Path]:
    """The shard roots of an embedded data dir (``shard-<i>``), in shard order."""
    d = Path(data_dir)
    roots = [p for p in d.glob("shard-*") if p.is_dir() and p.name[6:].isdigit()]
    return sorted(roots, key=lambda p: int(p.name[6:]))


def held(data_dir: str | Path) -> dict[str, str]:
    """Per shard root that holds snapshots, the newest one (what a shard would restore)."""
    out = {}
    for root in shard_roots(data_dir):
        snaps = root / "snapshots"
        names = sorted(p.name for p in snaps.iterdir() if SNAPSHOT_RE.match(p.name)) \
            if snaps.is_dir() else []
        if (root / "LATEST").exists() or names:
            latest = (root / "LATEST").read_text().strip() if (root / "LATEST").exists() else None
            out[root.name] = latest or names[-1]
    return out


def discard(data_dir: str | Path) -> int:
    """Remove every snapshot of an embedded data dir (``--fresh``); returns how many."""
    count = 0
    for root in shard_roots(data_dir):
        (root / "LATEST").unlink(missing_ok=True)  # first: never a LATEST naming a missing one
        snaps = root / "snapshots"
        if snaps.is_dir():
            count += sum(1 for p in snaps.iterdir() if SNAPSHOT_RE.match(p.name))
            shutil.rmtree(snaps)
    return count
