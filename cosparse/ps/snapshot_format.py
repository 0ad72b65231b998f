"""One shard's snapshots on disk: writing one atomically, and reading a chain back.

Tables are keyed ``NAMESPACE/TABLE`` in the manifest; a snapshot written before namespaces keys
them ``TABLE``, which restores into ``default`` (``cosparse.ps.namespaces``).

Snapshots are directories ``root/snapshots/<seq>-full|incr`` holding ``.npy`` files (IDs, rows
with state, versions per table) and a JSON manifest with the sha256 of every file, written into
a temporary directory, fsynced and renamed into place; then ``root/LATEST`` names the newest one
(also atomically). An incremental snapshot holds only rows dirtied since the previous snapshot
and names it as its parent; a restore follows the chain down to a full one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from cosparse.durable import fsync_dir
from cosparse.owner import owner_tag, sweep
from cosparse.ps.shard_table import ShardTable
from cosparse.ps.table_config import NAME_RE

SNAPSHOT_FORMAT = "cosparse-ps-snapshot"
SNAPSHOT_VERSION = 1


class SnapshotError(RuntimeError):
    """A snapshot that cannot be written or restored (checksum, format, chain)."""


def write_snapshot(root: str | Path, tables: Mapping[str, ShardTable], shard: int, num_shards: int,
                   write_counter: int, last_seq: int, incremental: bool) -> tuple[str, int]:
    """Write the tables' rows (only the dirty ones when ``incremental`` and there is a parent)
    into a new snapshot under ``root`` and point ``root/LATEST`` at it; the rows written are
    clean afterwards. Returns (its name, its sequence number, above ``last_seq``)."""
    root = Path(root)
    snaps = root / "snapshots"
    snaps.mkdir(parents=True, exist_ok=True)
    parent = read_latest(root)
    incremental = incremental and parent is not None
    # past every snapshot on disk too: a run killed between its shards' snapshot and the
    # trainer's commit leaves an orphan of the number a resumed run would reuse (pruned later)
    on_disk = [seq_of(d.name) for d in snaps.iterdir() if _NAME_RE.match(d.name)]
    seq = max(last_seq, seq_of(parent) if parent else 0, *on_disk) + 1
    name = f"{seq:08d}-{'incr' if incremental else 'full'}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-{owner_tag()}-", dir=snaps))
    written: list[tuple[ShardTable, np.ndarray]] = []
    try:
        manifest = {"format": SNAPSHOT_FORMAT, "version": SNAPSHOT_VERSION,
                    "kind": "incremental" if incremental else "full",
                    "parent": parent if incremental else None, "seq": seq,
                    "shard": shard, "num_shards": num_shards,
                    "write_counter": write_counter, "tables": {}}
        for i, (tname, t) in enumerate(sorted(tables.items())):
            occ = t.occupied_slots()
            slots = occ[t.dirty] if incremental else occ
            files = {}
            for suffix, arr in (("ids", t.ids_by_slot()[slots]), ("rows", t.read(slots, True)),
                                ("versions", t.versions[slots])):
                fname = f"t{i}.{suffix}.npy"
                files[fname] = _write_npy(tmp / fname, arr)
            manifest["tables"][tname] = {"config": dataclasses.asdict(t.cfg),
                                         "namespace": t.namespace,
                                         "registered_by": t.registered_by,
                                         "rows": int(slots.shape[0]), "files": files}
            written.append((t, slots))
        data = json.dumps(manifest, indent=1, sort_keys=True).encode()
        _write_bytes(tmp / "manifest.json", data)
        fsync_dir(tmp)
        os.rename(tmp, snaps / name)
        fsync_dir(snaps)
        _write_bytes(root / ".LATEST.tmp", name.encode())
        os.replace(root / ".LATEST.tmp", root / "LATEST")
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for t, slots in written:
        t.clean(slots)
    return name, seq


def snapshot_chain(root: Path, name: str | None, shard: int, num_shards: int
                   ) -> tuple[str, list[tuple[str, dict]]] | None:
    """(the snapshot to restore, its chain of (name, manifest) newest first) for shard ``shard``
    of ``num_shards``: ``name``, or the newest one by default; None when there is none. Sweeps
    what a shard killed mid-snapshot left."""
    sweep(root / "snapshots", [".tmp-"])
    latest = read_latest(root) if name is None else name
    if latest is None:
        return None
    if name is not None and not (root / "snapshots" / name).is_dir():
        raise SnapshotError(f"{root}: no snapshot named {name!r}")
    chain = []
    current: str | None = latest
    while current is not None:
        if not NAME_RE.match(current):
            raise SnapshotError(f"bad snapshot name {current!r} in chain")
        m = read_manifest(root / "snapshots" / current)
        if (m["shard"], m["num_shards"]) != (shard, num_shards):
            raise SnapshotError(f"snapshot {current} belongs to shard {m['shard']}/"
                                f"{m['num_shards']}, not {shard}/{num_shards}")
        chain.append((current, m))
        current = m["parent"] if m["kind"] == "incremental" else None
    return latest, chain


def read_table_arrays(d: Path, tname: str, tm: dict, width: int
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, rows [n, width], versions) of table ``tname`` in snapshot directory ``d``, from its
    manifest entry ``tm``; every file's checksum is verified."""
    arrs = {}
    for fname, digest in tm["files"].items():
        if not NAME_RE.match(fname):
            raise SnapshotError(f"{d}: bad file name {fname!r}")
        raw = (d / fname).read_bytes()
        if hashlib.sha256(raw).hexdigest() != digest:
            raise SnapshotError(f"{d / fname}: checksum mismatch")
        arrs[fname.split(".")[1]] = np.load(d / fname, allow_pickle=False)
    ids, rows, vers = arrs["ids"], arrs["rows"], arrs["versions"]
    if rows.shape != (ids.shape[0], width) or vers.shape != ids.shape:
        raise SnapshotError(f"{d}: table '{tname}' arrays have inconsistent shapes")
    return ids, rows, vers


_NAME_RE = re.compile(r"^\d{8}-(full|incr)$")


def seq_of(name: str) -> int:
    """The sequence number of a snapshot name (``00000012-incr`` -> 12)."""
    return int(name.split("-")[0])


def read_latest(root: Path) -> str | None:
    """The snapshot ``root/LATEST`` names (None: no LATEST); a missing one is a SnapshotError."""
    p = root / "LATEST"
    if not p.exists():
        return None
    name = p.read_text().strip()
    if not NAME_RE.match(name) or not (root / "snapshots" / name).is_dir():
        raise SnapshotError(f"{p}: names a missing or invalid snapshot {name!r}")
    return name


def read_manifest(d: Path) -> dict:
    """The manifest of snapshot directory ``d`` (format and version checked)."""
    try:
        m = json.loads((d / "manifest.json").read_text())
    except (OSError, ValueError) as e:
        raise SnapshotError(f"{d}: unreadable manifest ({e})") from e
    if m.get("format") != SNAPSHOT_FORMAT or m.get("version") != SNAPSHOT_VERSION:
        raise SnapshotError(f"{d}: unsupported snapshot format {m.get('format')!r} "
                            f"version {m.get('version')!r}")
    return m


def _write_bytes(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _write_npy(path: Path, arr: np.ndarray) -> str:
    with open(path, "wb") as f:
        np.save(f, np.ascontiguousarray(arr), allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    return hashlib.sha256(path.read_bytes()).hexdigest()
