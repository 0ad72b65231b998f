"""One shard's snapshots on disk: writing one atomically, and reading a chain back.

Tables are keyed ``NAMESPACE/TABLE`` in the manifest; a snapshot written before namespaces keys
them ``TABLE``, which restores into ``default`` (``cosparse.ps.namespaces``).

The manifest records the training run each namespace's rows belong to (``run_ids``: namespace
-> run ID, see ``cosparse.ps.run_ids``; absent in snapshots written before issue 32), so a resume
refuses another run's rows under the same snapshot names.

Snapshots are directories ``root/snapshots/<seq>-full|incr`` holding ``.npy`` files (IDs, rows
with state, versions per table) and a JSON manifest with the sha256 and size of every file (sizes
since issue 31: older manifests are checked by checksum alone), written into
a temporary directory, fsynced and renamed into place; then ``root/LATEST`` names the newest one
(also atomically). An incremental snapshot holds only rows dirtied since the previous snapshot
and names it as its parent; a restore follows the chain down to a full one.

A restore trusts nothing it reads: a chain that loops or passes ``MAX_CHAIN_LENGTH``, a manifest
whose files are missing or of another size, a checksum mismatch, and NaN or infinite rows are
each a ``SnapshotError`` naming the snapshot directory or file (``ps serve`` exits 2 with it).
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
                   write_counter: int, last_seq: int, incremental: bool,
                   run_ids: Mapping[str, str] | None = None) -> tuple[str, int]:
    """Write the tables' rows (only the dirty ones when ``incremental`` and there is a parent)
    into a new snapshot under ``root`` and point ``root/LATEST`` at it; the rows written are
    clean afterwards. ``run_ids``: the run each namespace's rows belong to (``run_ids``),
    recorded in the manifest. Returns (its name, its sequence number, above ``last_seq``)."""
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
                    "write_counter": write_counter, "run_ids": dict(run_ids or {}),
                    "tables": {}}
        for i, (tname, t) in enumerate(sorted(tables.items())):
            occ = t.occupied_slots()
            slots = occ[t.dirty] if incremental else occ
            files, sizes = {}, {}
            for suffix, arr in (("ids", t.ids_by_slot()[slots]), ("rows", t.read(slots, True)),
                                ("versions", t.versions[slots])):
                fname = f"t{i}.{suffix}.npy"
                files[fname], sizes[fname] = _write_npy(tmp / fname, arr)
            manifest["tables"][tname] = {"config": dataclasses.asdict(t.cfg),
                                         "namespace": t.namespace,
                                         "registered_by": t.registered_by,
                                         "rows": int(slots.shape[0]), "files": files,
                                         "sizes": sizes}
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
    what a shard killed mid-snapshot left. Every manifest of the chain is checked before any
    row is read: the chain (``walk_chain``), the shard, and the files it names (``check_files``)."""
    sweep(root / "snapshots", [".tmp-"])
    latest = read_latest(root) if name is None else name
    if latest is None:
        return None
    if name is not None and not (root / "snapshots" / name).is_dir():
        raise SnapshotError(f"{root}: no snapshot named {name!r}")
    chain = walk_chain(root, latest)
    for current, m in chain:
        if (m.get("shard"), m.get("num_shards")) != (shard, num_shards):
            raise SnapshotError(f"snapshot {root / 'snapshots' / current} belongs to shard "
                                f"{m.get('shard')}/{m.get('num_shards')}, not {shard}/{num_shards}")
        check_files(root / "snapshots" / current, m)
    return latest, chain


def walk_chain(root: str | Path, name: str) -> list[tuple[str, dict]]:
    """``name`` and the snapshots it depends on, newest first (ending with a full one), each with
    its manifest. Refused (``SnapshotError``): a name that is not a snapshot's, a parent that is
    not older than its child (which rules out a chain that loops), and a chain longer than
    ``MAX_CHAIN_LENGTH``."""
    snaps = Path(root) / "snapshots"
    out: list[tuple[str, dict]] = []
    seen: set[str] = set()
    current: str | None = name
    while current is not None:
        if not isinstance(current, str) or not _NAME_RE.match(current):
            raise SnapshotError(f"{snaps}: bad snapshot name {current!r} in the chain of {name!r}")
        if current in seen:
            raise SnapshotError(f"{snaps}: the chain of {name!r} loops: {current!r} is its own "
                                f"ancestor ({' -> '.join(n for n, _ in out)} -> {current})")
        if out and seq_of(current) >= seq_of(out[-1][0]):
            raise SnapshotError(f"{snaps / out[-1][0]}: names {current!r} as its parent, which is "
                                "not older (a parent's sequence number is always lower)")
        if len(out) >= MAX_CHAIN_LENGTH:
            raise SnapshotError(f"{snaps}: the chain of {name!r} is longer than "
                                f"{MAX_CHAIN_LENGTH} snapshots (a trainer writes a full one every "
                                "store.remote.snapshot_keep saves); refused")
        seen.add(current)
        m = read_manifest(snaps / current)
        out.append((current, m))
        current = m.get("parent") if m.get("kind") == "incremental" else None
    return out


def check_files(d: Path, m: dict) -> None:
    """Check manifest ``m`` of snapshot directory ``d`` against the files it names, without
    reading them: each table names its ids, rows and versions files, each of them exists, and
    has the size the manifest records (manifests written before sizes were recorded: their
    checksums, verified on reading, are the only check)."""
    tables = m.get("tables")
    if not isinstance(tables, dict):
        raise SnapshotError(f"{d / 'manifest.json'}: no 'tables' mapping")
    for tname, tm in tables.items():
        files = tm.get("files") if isinstance(tm, dict) else None
        if not isinstance(files, dict) or sorted(f.split(".")[1] for f in files
                                                 if f.count(".") == 2) != _ARRAYS:
            raise SnapshotError(f"{d / 'manifest.json'}: table '{tname}' must name one ids, rows "
                                f"and versions file each, got {files!r}")
        sizes = tm.get("sizes") or {}
        for fname in files:
            if not NAME_RE.match(fname):
                raise SnapshotError(f"{d}: bad file name {fname!r}")
            try:
                size = (d / fname).stat().st_size
            except OSError as e:
                raise SnapshotError(f"{d / fname}: named by the manifest, unreadable ({e})") from e
            if fname in sizes and sizes[fname] != size:
                raise SnapshotError(f"{d / fname}: {size} bytes, the manifest records "
                                    f"{sizes[fname]} (truncated or replaced)")


def read_table_arrays(d: Path, tname: str, tm: dict, width: int
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, rows [n, width], versions) of table ``tname`` in snapshot directory ``d``, from its
    manifest entry ``tm``; every file's checksum is verified, and every row and its optimizer
    state must be finite."""
    arrs = {}
    for fname, digest in tm["files"].items():
        if not NAME_RE.match(fname):
            raise SnapshotError(f"{d}: bad file name {fname!r}")
        raw = (d / fname).read_bytes()
        if hashlib.sha256(raw).hexdigest() != digest:
            raise SnapshotError(f"{d / fname}: checksum mismatch")
        arrs[fname.split(".")[1]] = np.load(d / fname, allow_pickle=False)
    if sorted(arrs) != _ARRAYS:
        raise SnapshotError(f"{d}: table '{tname}' must have ids, rows and versions files, "
                            f"got {sorted(tm['files'])}")
    ids, rows, vers = arrs["ids"], arrs["rows"], arrs["versions"]
    if rows.shape != (ids.shape[0], width) or vers.shape != ids.shape:
        raise SnapshotError(f"{d}: table '{tname}' arrays have inconsistent shapes")
    if rows.dtype != np.float32 or ids.dtype != np.int64 or vers.dtype != np.int64:
        raise SnapshotError(f"{d}: table '{tname}' arrays have dtypes {ids.dtype}, {rows.dtype}, "
                            f"{vers.dtype}, not int64, float32, int64")
    for a in range(0, rows.shape[0], FINITE_CHUNK_ROWS):  # rows and optimizer state
        ok = np.isfinite(rows[a : a + FINITE_CHUNK_ROWS]).all(axis=1)
        if not ok.all():
            bad = a + np.flatnonzero(~ok)
            raise SnapshotError(f"{d}: table '{tname}' holds NaN or infinite values (rows or "
                                f"optimizer state) in row ID {int(ids[bad[0]])}, and maybe more; "
                                "refused: such rows never train again (restore an older snapshot)")
    return ids, rows, vers


_NAME_RE = re.compile(r"^\d{8}-(full|incr)$")
_ARRAYS = ["ids", "rows", "versions"]
MAX_CHAIN_LENGTH = 1024  # snapshots in one chain (a full one and the incremental ones over it)
FINITE_CHUNK_ROWS = 1 << 16  # rows checked for NaN/inf at a time (bounds the temporary)


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


def _write_npy(path: Path, arr: np.ndarray) -> tuple[str, int]:
    """Write ``arr``; (the file's sha256, its size in bytes)."""
    with open(path, "wb") as f:
        np.save(f, np.ascontiguousarray(arr), allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    raw = path.read_bytes()
    return hashlib.sha256(raw).hexdigest(), len(raw)
