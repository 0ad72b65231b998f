"""The files of a serving export: per table, its rows (ID and embedding, no optimizer state) in
Parquet or ``.npy`` shards, and one JSON manifest naming them with their sha256.

An export directory holds ``manifest.json`` and one sub-directory per table::

    manifest.json
    <table>/part-00000.parquet          (file_format parquet: columns id int64, embedding
                                         fixed_size_list<float32|float16>[dim])
    <table>/00000.ids.npy, 00000.rows.npy  (file_format npy: int64 [n], float [n, dim])
    <table>/removed.npy                 (a delta only: IDs the later step no longer holds)

Rows are sorted by ID across a table's shards. The manifest::

    {"format": "cosparse-serving-export", "version": 1, "kind": "full" | "delta",
     "step": S, "since": null | STEP, "step_range": [since or 0, S],
     "versions": {"export": 1, "checkpoint_format": 1, "cosparse": "0.1.0"},
     "checkpoint": "<path>", "dtype": "float32" | "float16", "file_format": ...,
     "tables": {name: {"dim", "dtype", "rows", "removed", "source", "method",
                       "files": [{"path", "role": "rows" | "removed", "rows", "sha256"}]}},
     "dense": {...}}                    (the dense model: ``cosparse.serving.dense``)

This module needs numpy and pyarrow only (no torch): the reader (``cosparse.serving.load``)
uses it on a serving host.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "cosparse-serving-export"
VERSION = 1
MANIFEST = "manifest.json"
FILE_FORMATS = ("parquet", "npy")


class ServingError(ValueError):
    """An export that cannot be written or read (checksum, format, a broken chain of deltas)."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsynced(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def write_rows(out: Path, table: str, ids: np.ndarray, rows: np.ndarray, file_format: str,
               shard_rows: int) -> list[dict[str, Any]]:
    """Write one table's rows (sorted by ID) into ``out/<table>/`` in shards of at most
    ``shard_rows`` rows; returns their manifest entries."""
    d = out / table
    d.mkdir(parents=True, exist_ok=True)
    entries = []
    n = ids.shape[0]
    for k, lo in enumerate(range(0, max(n, 1), shard_rows)):
        part_ids, part_rows = ids[lo:lo + shard_rows], rows[lo:lo + shard_rows]
        if file_format == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            dim = rows.shape[1]
            emb = pa.FixedSizeListArray.from_arrays(
                pa.array(np.ascontiguousarray(part_rows).reshape(-1)), dim)
            paths = [d / f"part-{k:05d}.parquet"]
            pq.write_table(pa.table({"id": pa.array(part_ids, pa.int64()), "embedding": emb}),
                           paths[0])
        else:
            paths = [d / f"{k:05d}.ids.npy", d / f"{k:05d}.rows.npy"]
            np.save(paths[0], np.ascontiguousarray(part_ids, np.int64), allow_pickle=False)
            np.save(paths[1], np.ascontiguousarray(part_rows), allow_pickle=False)
        for p in paths:
            _fsynced(p)
            entries.append({"path": f"{table}/{p.name}", "role": "rows",
                            "rows": int(part_ids.shape[0]), "sha256": sha256_file(p)})
    return entries


def write_removed(out: Path, table: str, removed: np.ndarray) -> list[dict[str, Any]]:
    """A delta's removed IDs of one table (none: no file)."""
    if not removed.shape[0]:
        return []
    p = out / table / "removed.npy"
    p.parent.mkdir(parents=True, exist_ok=True)
    np.save(p, np.ascontiguousarray(removed, np.int64), allow_pickle=False)
    _fsynced(p)
    return [{"path": f"{table}/{p.name}", "role": "removed", "rows": int(removed.shape[0]),
             "sha256": sha256_file(p)}]


def write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    with open(out / MANIFEST, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def read_manifest(d: Path) -> dict[str, Any]:
    """The manifest of export directory ``d`` (format and version checked)."""
    try:
        m = json.loads((d / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise ServingError(f"{d}: no readable {MANIFEST} ({e}); is it a `cosparse export` "
                           "directory?") from e
    if m.get("format") != FORMAT or m.get("version") != VERSION:
        raise ServingError(f"{d}: unsupported export format {m.get('format')!r} version "
                           f"{m.get('version')!r} (this build reads {FORMAT} {VERSION})")
    return m


def verify(d: Path, manifest: dict[str, Any]) -> None:
    """Every file the manifest names is there with its sha256."""
    for tname, tm in manifest["tables"].items():
        for f in tm["files"]:
            p = d / f["path"]
            if p.parent.parent != d or p.parent.name != tname:
                raise ServingError(f"{d}: manifest names a file outside table '{tname}': "
                                   f"{f['path']!r}")
            if not p.is_file():
                raise ServingError(f"{p}: missing (named by {d / MANIFEST})")
            if sha256_file(p) != f["sha256"]:
                raise ServingError(f"{p}: checksum mismatch (the file changed since it was "
                                   "exported: export again)")


def read_table(d: Path, manifest: dict[str, Any], table: str
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, rows [n, dim], removed IDs) of one table of the export in ``d``."""
    tm = manifest["tables"][table]
    dim, dtype = int(tm["dim"]), np.dtype(tm["dtype"])
    ids, rows, removed = [], [], []
    files = tm["files"]
    if manifest["file_format"] == "parquet":
        import pyarrow.parquet as pq

        for f in files:
            if f["role"] != "rows":
                continue
            t = pq.read_table(d / f["path"])
            ids.append(t.column("id").to_numpy())
            emb = t.column("embedding").combine_chunks()
            rows.append(emb.values.to_numpy(zero_copy_only=False).reshape(-1, dim))
    else:
        for f in files:
            if f["role"] == "rows" and f["path"].endswith(".ids.npy"):
                ids.append(np.load(d / f["path"], allow_pickle=False))
                rows.append(np.load(d / f["path"].replace(".ids.npy", ".rows.npy"),
                                    allow_pickle=False))
    removed = [np.load(d / f["path"], allow_pickle=False) for f in files if f["role"] == "removed"]
    out_ids = np.concatenate(ids).astype(np.int64) if ids else np.zeros(0, np.int64)
    out_rows = np.concatenate(rows).astype(dtype, copy=False) if rows else \
        np.zeros((0, dim), dtype)
    if out_rows.shape != (out_ids.shape[0], dim):
        raise ServingError(f"{d}: table '{table}' has {out_ids.shape[0]} IDs and rows of shape "
                           f"{out_rows.shape}, expected dim {dim}")
    return out_ids, out_rows, (np.concatenate(removed).astype(np.int64) if removed
                               else np.zeros(0, np.int64))
