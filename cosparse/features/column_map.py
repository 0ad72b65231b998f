"""Model inputs straight from a raw source's columns, without a feature spec (``data.columns``):
dense columns as floats (missing: 0), sparse columns hashed to IDs (one per row, none when
missing), sequence and list columns hashed element by element (one bag per row).

Each column's IDs are seeded by ``data.columns.hash_seed`` and the column's name, so two columns
sharing a table do not share rows for one value, unless ``data.columns.id_space`` says they name
one entity (a target and its history): then they share the first column's seed. ``sparse: auto``
takes every column not named elsewhere: ints, strings and lists hashed, floats (which hashing would
scatter) dense. ``datetime`` columns give calendar fields (the platform's ``datetime`` transform),
each its own sparse feature ``<column>_<field>``. The hashing is the feature platform's ``hash``
transform's kernels, so a spec with ``hash: {seed: S}`` on a column computes the same IDs for the
seed this module derives (``column_seed``).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from cosparse.batch import SparseBatch
from cosparse.config import ColumnsConfig, ConfigError
from cosparse.data.errors import DataError
from cosparse.features import kernels as K
from cosparse.features.sources import RawSource
from cosparse.features.targets import Targets
from cosparse.features.transforms.time import DATETIME
from cosparse.features.types import FLOAT, INT, LIST_KINDS, STRING_KINDS, Column


def column_seed(hash_seed: int, name: str) -> int:
    """The hash seed of one column's IDs."""
    return (hash_seed * 0x9E3779B1 + zlib.crc32(name.encode())) % 2**62


def column_roles(kinds: dict[str, str], cols: ColumnsConfig) -> tuple[list[str], list[str]]:
    """(ID columns: sparse then sequence, dense columns) of a source with columns ``kinds``
    (the label and dropped columns left out), or a ConfigError naming the key and column."""
    for role, names in (("dense", cols.dense), ("sequence", cols.sequence),
                        ("sparse", [] if cols.sparse == "auto" else cols.sparse)):
        for n in names:
            if n not in kinds:
                raise ConfigError(f"data.columns.{role}: no column '{n}' in the data (columns: "
                                  f"{', '.join(kinds)})")
            kind = kinds[n]
            if role == "dense" and kind not in (INT, FLOAT):
                raise ConfigError(f"data.columns.dense: column '{n}' holds {kind} values, not "
                                  "numbers (list it as sparse)")
            if role == "sequence" and kind not in LIST_KINDS:
                raise ConfigError(f"data.columns.sequence: column '{n}' holds {kind} values, not "
                                  "lists (data.schema: {" + n + ": list<int64>})")
            if role == "sparse" and kind in (FLOAT, "list_float"):
                raise ConfigError(f"data.columns.sparse: column '{n}' holds floats, which "
                                  "hashing would scatter (list it as dense)")
    for n in cols.datetime:
        if n not in kinds:
            raise ConfigError(f"data.columns.datetime: no column '{n}' in the data (columns: "
                              f"{', '.join(kinds)})")
        if kinds[n] not in (INT, "string"):
            raise ConfigError(f"data.columns.datetime.{n}: column '{n}' holds {kinds[n]} "
                              "values, not times (int or string)")
    dense = list(cols.dense)
    if cols.sparse == "auto":
        named = (set(cols.dense) | set(cols.sequence) | set(cols.datetime)
                 | set(cols.target_columns()))
        rest = [c for c in kinds if c not in named]
        sparse = [c for c in rest if kinds[c] != FLOAT]
        dense += [c for c in rest if kinds[c] == FLOAT]
    else:
        sparse = list(cols.sparse)
    return sparse + list(cols.sequence), dense


def id_space_seeds(kinds: dict[str, str], id_columns: list[str],
                   cols: ColumnsConfig) -> dict[str, str]:
    """The column whose seed each ``data.columns.id_space`` column hashes with, or a ConfigError
    naming a column that is not an ID column, or a group whose values are of different types
    (an int and its text never hash alike)."""
    out: dict[str, str] = {}
    for first, others in cols.id_space.items():
        group = [first, *others]
        for n in group:
            if n not in id_columns:
                raise ConfigError(f"data.columns.id_space.{first}: '{n}' is not an ID column of "
                                  f"the data (ID columns: {', '.join(id_columns)})")
        types = {n: "string" if kinds[n] in STRING_KINDS else "int" for n in group}
        if len(set(types.values())) > 1:
            said = ", ".join(f"{n}: {t}" for n, t in types.items())
            raise ConfigError(f"data.columns.id_space.{first}: its columns hold different types "
                              f"({said}), whose values never hash alike; read them as one type "
                              "(data.schema)")
        out.update({n: first for n in group})
    return out


def column_ids(col: Column, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(IDs, bag length per row) of one column."""
    if col.kind in STRING_KINDS:
        ids = K.hash_strings(col.values, col.offsets, seed, 0)
    else:
        ids = K.hash_ints(col.values, seed, 0)
    if col.lengths is not None:
        return ids, col.lengths
    present = col.present_mask()
    return ids[present], present.astype(np.int64)


def _dense(col: Column) -> np.ndarray:
    v = col.values.astype(np.float32)
    if col.present is not None:
        v[~col.present] = 0.0
    return v


class ColumnMapReader:
    """A cosparse Reader over ``source`` whose columns ``cols`` maps to model inputs."""

    def __init__(self, source: RawSource, cols: ColumnsConfig,
                 regression: set[str] | None = None, on_bad_record: str = "fail") -> None:
        """``regression``: the tasks of ``cols.labels`` that are regressions."""
        self.source = source
        self.targets = (Targets(cols.labels, regression or set(), cols.weight, on_bad_record)
                        if cols.labels or cols.weight else None)
        self.id_columns, self.dense_keys = column_roles(dict(source.columns), cols)
        # (feature, time column, its format, field, since) of data.columns.datetime
        self.times = [(f"{c}_{f}", c, dt.format, f, dt.since) for c, dt in cols.datetime.items()
                      for f in dt.emit]
        n_sparse = len(self.id_columns) - len(cols.sequence)
        self.keys = (self.id_columns[:n_sparse] + [t[0] for t in self.times]
                     + self.id_columns[n_sparse:])
        self.num_dense: int = len(self.dense_keys)
        space = id_space_seeds(dict(source.columns), self.id_columns, cols)
        self.seeds = {c: column_seed(cols.hash_seed, space.get(c, c)) for c in self.keys}
        self.read = list(dict.fromkeys(self.id_columns + self.dense_keys + list(cols.datetime)
                                       + (self.targets.columns if self.targets else [])))

    @property
    def num_batches(self) -> int:
        return self.source.num_batches

    def tasks(self, start_batch: int = 0) -> Iterator[Any]:
        return self.source.tasks(start_batch)

    def build(self, task: Any) -> SparseBatch:
        raw = self.source.build_raw(task, self.read)  # type: ignore[call-arg]
        tasks, weights = None, None
        if self.targets is not None:
            raw, tasks, weights = self.targets.read(raw)
        n = raw.num_rows
        cols = dict(raw.columns)
        for key, col, fmt, emit, since in self.times:
            try:
                cols[key] = DATETIME.apply({"format": fmt, "emit": emit, "since": since},
                                           [raw.columns[col]], None)
            except DataError as e:
                raise DataError(f"{raw.source}data.columns.datetime.{col}: {e}") from None
        values, lengths = [], []
        for c in self.keys:
            ids, lens = column_ids(cols[c], self.seeds[c])
            values.append(ids)
            lengths.append(lens)
        dense = (np.stack([_dense(raw.columns[c]) for c in self.dense_keys], axis=1)
                 if self.dense_keys else np.zeros((n, 0), np.float32))
        return SparseBatch(
            list(self.keys),
            torch.from_numpy(np.concatenate(values) if values else np.zeros(0, np.int64)),
            torch.from_numpy(np.concatenate(lengths) if lengths else np.zeros(0, np.int64)),
            torch.from_numpy(np.ascontiguousarray(dense)),
            torch.from_numpy(np.ascontiguousarray(raw.labels, np.float32)),
            bad_records=raw.bad_records, index=raw.index, dense_keys=list(self.dense_keys),
            task_labels=None if tasks is None else {t: torch.from_numpy(v)
                                                    for t, v in tasks.items()},
            weights=None if weights is None else torch.from_numpy(weights))
