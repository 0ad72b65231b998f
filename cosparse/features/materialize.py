"""Materialized features: write extracted features to Parquet keyed by feature version, and read
them back (``MaterializedReader``) without recomputing, refusing a stale or missing feature.

Layout of a materialization directory::

    manifest.json                 source (path, size, mtime), rows, feature -> version/kind/table/file
    labels.parquet                column ``label`` (float32)
    <feature>@<version>.parquet   column ``value``: float32 (dense) or list<int64> (sparse, sequence)

Row groups hold one materialization batch each.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from cosparse.batch import SparseBatch
from cosparse.data.errors import DataError
from cosparse.data.split import Split, num_batches, row_batches, split_range
from cosparse.features.extract import FeatureExtractor
from cosparse.features.feature_set import FeatureSet
from cosparse.features.reader import check_keys
from cosparse.features.sources import RawSource, read_parquet_rows
from cosparse.features.types import DENSE, FeatureSpecError

MANIFEST = "manifest.json"
LABELS = "labels.parquet"
FORMAT = 1


def feature_file(name: str, version: str) -> str:
    return f"{name}@{version}.parquet"


def _source_info(source: RawSource) -> dict[str, Any]:
    p = Path(source.path)
    st = os.stat(p)
    return {"kind": type(source).__name__, "path": str(p.resolve()), "size": st.st_size,
            "mtime_ns": st.st_mtime_ns, "split": getattr(source, "split", None),
            "eval_fraction": getattr(source, "eval_fraction", None)}


def materialize(source: RawSource, feature_set: FeatureSet, out_dir: str | Path,
                features: Sequence[str] | None = None, progress_every: int = 10,
                log: TextIO | None = None) -> dict[str, Any]:
    """Extract ``features`` (default: every feature of the spec) over all of ``source`` and write
    them under ``out_dir``. Returns the manifest. Quantile bucketizes must be fitted already.

    A progress line goes to ``log`` (default stderr) every ``progress_every`` batches (0: none).
    """
    log = sys.stderr if log is None else log
    feature_set.check_source(source.columns)
    names = list(feature_set.features) if features is None else list(dict.fromkeys(features))
    ex = FeatureExtractor(feature_set, names)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)  # a half-written directory has no manifest
    types = {n: pa.float32() if feature_set[n].kind == DENSE else pa.large_list(pa.int64())
             for n in names}
    writers = {n: pq.ParquetWriter(out / feature_file(n, feature_set.versions[n]),
                                   pa.schema([("value", types[n])])) for n in names}
    lab_w = pq.ParquetWriter(out / LABELS, pa.schema([("label", pa.float32())]))
    rows = bad = batches = 0
    t0 = time.perf_counter()
    total = source.num_batches
    try:
        for task in source.tasks():
            fb = ex.extract(source.build_raw(task))
            for n in names:
                if types[n] == pa.float32():
                    arr: pa.Array = pa.array(fb.dense_values(n), pa.float32())
                else:
                    v, ln = fb.ids(n)
                    off = np.zeros(len(ln) + 1, np.int64)
                    np.cumsum(ln, out=off[1:])
                    arr = pa.LargeListArray.from_arrays(pa.array(off), pa.array(v, pa.int64()))
                writers[n].write_table(pa.table({"value": arr}))
            lab_w.write_table(pa.table({"label": pa.array(fb.labels, pa.float32())}))
            rows += fb.num_rows
            bad += fb.bad_records
            batches += 1
            if progress_every and (batches % progress_every == 0 or batches == total):
                dt = time.perf_counter() - t0
                print(f"materialize: batch {batches}/{total}, {rows} rows, "
                      f"{rows / max(dt, 1e-9):,.0f} rows/s", file=log, flush=True)
    finally:
        for w in writers.values():
            w.close()
        lab_w.close()
    manifest = {
        "format": FORMAT,
        "rows": rows,
        "bad_records": bad,
        "batches": batches,
        "source": _source_info(source),
        "spec": feature_set.source_name,
        "fitted": {n: {str(j): b for j, b in d.items()} for n, d in feature_set.fitted().items()},
        "features": {n: {"version": feature_set.versions[n], "kind": feature_set[n].kind,
                         "table": feature_set[n].table, "rows": rows,
                         "file": feature_file(n, feature_set.versions[n])} for n in names},
    }
    tmp = out / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    tmp.replace(out / MANIFEST)
    return manifest


def read_manifest(dir: str | Path) -> dict[str, Any]:
    p = Path(dir) / MANIFEST
    try:
        m = json.loads(p.read_text())
    except OSError:
        raise DataError(f"{p}: no materialization manifest (not materialized, or unfinished)") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{p}: corrupt manifest ({e})") from None
    if m.get("format") != FORMAT:
        raise DataError(f"{p}: unsupported manifest format {m.get('format')!r}")
    return m


@dataclass(frozen=True)
class MaterializedTask:
    row_start: int
    num_rows: int
    index: int


def check_source_unchanged(manifest: dict[str, Any], where: Path, source_path: str | Path) -> None:
    """Raise unless the materialization was made from ``source_path`` as it is now."""
    src = manifest.get("source") or {}
    p = Path(source_path)
    if not p.exists():
        raise FeatureSpecError(f"data.path: {p} does not exist (the materialization in {where} "
                               f"was made from {src.get('path')})")
    if str(p.resolve()) != src.get("path"):
        raise FeatureSpecError(f"materialization in {where} was made from {src.get('path')}, "
                               f"not from data.path {p.resolve()}")
    st = os.stat(p)
    if (st.st_size, st.st_mtime_ns) != (src.get("size"), src.get("mtime_ns")):
        raise FeatureSpecError(f"materialization in {where} is stale: {p} changed since it was "
                               f"made (size {src.get('size')} -> {st.st_size}, modified since); "
                               "materialize it again")


class MaterializedReader:
    """Reader over a materialization directory: its batches are read back, never recomputed
    (``features_computed == 0``). A feature that is missing, or whose materialized version differs
    from what ``feature_set`` now produces, is refused at construction."""

    def __init__(self, dir: str | Path, feature_set: FeatureSet, sparse: Sequence[str],
                 dense: Sequence[str] = (), batch_size: int = 4096, split: Split = "train",
                 eval_fraction: float = 0.2, source_path: str | Path | None = None) -> None:
        """``source_path``: the raw data the run names; a materialization of other data, or of
        this file before it changed (size or modification time), is refused."""
        if batch_size <= 0:
            raise ValueError("batch_size must be positive")
        self.dir = Path(dir)
        m = read_manifest(self.dir)
        if source_path is not None:
            check_source_unchanged(m, self.dir, source_path)
        fitted = {n: {int(j): b for j, b in d.items()} for n, d in m.get("fitted", {}).items()}
        if fitted and feature_set.unfitted():
            feature_set = feature_set.with_fitted(fitted)  # the boundaries fitted at materialization
        check_keys(feature_set, sparse, dense)
        have = m["features"]
        self.files: dict[str, str] = {}
        for n in list(sparse) + list(dense):
            want = feature_set.versions[n]
            if n not in have:
                raise FeatureSpecError(f"feature '{n}' (version {want}) is not materialized in "
                                       f"{self.dir} (it holds: {', '.join(have) or 'nothing'})")
            got = have[n]["version"]
            if got != want:
                raise FeatureSpecError(f"feature '{n}': materialization in {self.dir} is stale: it "
                                       f"holds version {got}, the spec now produces {want}")
            self.files[n] = str(self.dir / have[n]["file"])
        self.feature_set = feature_set
        self.keys: list[str] = list(sparse)
        self.dense_keys: list[str] = list(dense)
        self.num_dense: int = len(self.dense_keys)
        self.batch_size = batch_size
        self.split: Split = split
        self.eval_fraction = eval_fraction
        self.row_start, self.num_rows = split_range(int(m["rows"]), eval_fraction, split)

    @property
    def num_batches(self) -> int:
        return num_batches(self.num_rows, self.batch_size)

    def tasks(self, start_batch: int = 0) -> Iterator[MaterializedTask]:
        for lo, n, i in row_batches(self.num_rows, self.batch_size, start_batch):
            yield MaterializedTask(self.row_start + lo, n, i)

    def build(self, task: MaterializedTask) -> SparseBatch:
        n = task.num_rows
        lab = read_parquet_rows(str(self.dir / LABELS), ["label"], task.row_start, n)
        labels = np.array(lab.column("label").combine_chunks().to_numpy(zero_copy_only=False),
                          np.float32)
        vals, lens = [], []
        for k in self.keys:
            col = read_parquet_rows(self.files[k], ["value"], task.row_start, n).column("value")
            arr = col.combine_chunks()
            lens.append(np.asarray(arr.value_lengths().fill_null(0).to_numpy(zero_copy_only=False),
                                   np.int64))
            vals.append(np.asarray(arr.flatten().to_numpy(zero_copy_only=False), np.int64))
        dense = np.empty((n, len(self.dense_keys)), np.float32)
        for j, k in enumerate(self.dense_keys):
            col = read_parquet_rows(self.files[k], ["value"], task.row_start, n).column("value")
            dense[:, j] = col.combine_chunks().to_numpy(zero_copy_only=False)
        values = np.concatenate(vals) if vals else np.zeros(0, np.int64)
        lengths = np.concatenate(lens) if lens else np.zeros(0, np.int64)
        return SparseBatch(self.keys, torch.from_numpy(values), torch.from_numpy(lengths),
                           torch.from_numpy(dense), torch.from_numpy(labels), 0, task.index,
                           dense_keys=list(self.dense_keys), features_computed=0)
