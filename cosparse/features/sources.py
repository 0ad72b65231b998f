"""Raw sources: the RawSource protocol, the Criteo TSV source (the numba parser of
``cosparse.data.kernels``) and a generic Parquet source (any scalar or list columns).

A source cuts its split into cheap picklable tasks in batch order (main process) and builds one
RawBatch per task (pure; in worker processes). Bad records raise DataError with ``file:line`` /
``file: row N`` and the column, or are dropped and counted (``on_bad_record="skip"``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cosparse.config import LabelConfig, ShuffleConfig
from cosparse.config.labels import as_label
from cosparse.data import kernels as DK
from cosparse.data.criteo import CriteoTask, CriteoTSVReader, describe_bad_line
from cosparse.data.errors import DataError
from cosparse.data.shuffle import shuffled_batches
from cosparse.data.split import Split, num_batches, row_batches, split_range
from cosparse.features import label_map
from cosparse.features.types import (
    FLOAT,
    INT,
    LIST_FLOAT,
    LIST_INT,
    LIST_STRING,
    STRING,
    Column,
    ColumnKind,
    RawBatch,
    from_arrow_strings,
)

OnBadRecord = Literal["fail", "skip"]
CRITEO_INT = [f"I{i + 1}" for i in range(DK.NUM_INT)]
CRITEO_CAT = [f"C{i + 1}" for i in range(DK.NUM_CAT)]


@runtime_checkable
class RawSource(Protocol):
    """A source of RawBatches: ``columns`` (name -> kind), tasks in batch order, ``build_raw``."""

    columns: dict[str, ColumnKind]
    path: str

    @property
    def num_batches(self) -> int: ...

    def tasks(self, start_batch: int = 0) -> Iterator[Any]: ...

    def build_raw(self, task: Any) -> RawBatch: ...


def _check_common(batch_size: int, on_bad_record: str) -> None:
    if batch_size <= 0:
        raise ValueError("batch_size must be positive")
    if on_bad_record not in ("fail", "skip"):
        raise ValueError(f"on_bad_record must be 'fail' or 'skip', got {on_bad_record!r}")


class CriteoRawSource:
    """Criteo TSV (plain or gzip): I1..I13 int64 with presence, C1..C26 int64 (the parsed hex) with
    presence, and the labels."""

    def __init__(self, path: str | Path, batch_size: int, split: Split = "train",
                 eval_fraction: float = 0.2, on_bad_record: OnBadRecord = "fail",
                 shuffle: ShuffleConfig | None = None) -> None:
        _check_common(batch_size, on_bad_record)
        self._lines = CriteoTSVReader(path, batch_size, split, eval_fraction, on_bad_record,
                                      shuffle)
        self.path = self._lines.path
        self.batch_size = batch_size
        self.split: Split = split
        self.eval_fraction = eval_fraction
        self.on_bad_record: OnBadRecord = on_bad_record
        self.columns: dict[str, ColumnKind] = {c: INT for c in CRITEO_INT + CRITEO_CAT}

    @property
    def num_batches(self) -> int:
        return self._lines.num_batches

    def tasks(self, start_batch: int = 0) -> Iterator[CriteoTask]:
        return self._lines.tasks(start_batch)

    def build_raw(self, task: CriteoTask) -> RawBatch:
        buf = np.frombuffer(task.data, np.uint8)
        labels, ints, ipres, cats, cpres, err, err_col, ncols = DK.parse_criteo_chunk(buf, task.num_lines)
        keep = err == DK.ERR_OK
        bad = int(task.num_lines - np.count_nonzero(keep))
        if bad:
            if self.on_bad_record == "fail":
                li = int(np.flatnonzero(~keep)[0])
                raise DataError(describe_bad_line(task.path, task.line_no(li), task.data, li,
                                                  int(err[li]), int(err_col[li]), int(ncols[li])))
            labels, ints, ipres, cats, cpres = labels[keep], ints[keep], ipres[keep], cats[keep], cpres[keep]
        it, ipt = np.ascontiguousarray(ints.T), np.ascontiguousarray(ipres.T)
        ct, cpt = np.ascontiguousarray(cats.T), np.ascontiguousarray(cpres.T)
        cols = {name: Column(INT, it[j], ipt[j]) for j, name in enumerate(CRITEO_INT)}
        cols.update({name: Column(INT, ct[j], cpt[j]) for j, name in enumerate(CRITEO_CAT)})
        return RawBatch(cols, np.ascontiguousarray(labels, np.float32), task.index, bad,
                        f"{task.path}: ")


# --- Parquet ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RowsTask:
    """Rows ``row_start .. row_start + num_rows - 1`` (0-based) of a Parquet file; ``keep``:
    the rows among them that the batch holds, in its order (a split's, or shuffled), or None
    for all."""

    path: str
    row_start: int
    num_rows: int
    index: int
    keep: np.ndarray | None = None


_FILES: dict[str, tuple[tuple[int, int], pq.ParquetFile]] = {}
_LAST: dict[tuple[str, tuple[str, ...]], tuple[tuple[int, ...], pa.Table]] = {}


def open_parquet(path: str) -> pq.ParquetFile:
    """The file, opened once per process (reopened when its size or mtime changes)."""
    try:
        st = os.stat(path)
    except OSError:
        raise DataError(f"{path}: data file not found") from None
    stamp = (st.st_size, st.st_mtime_ns)
    cached = _FILES.get(path)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path}: cannot read as Parquet ({e})") from e
    _FILES[path] = (stamp, pf)
    return pf


def read_parquet_rows(path: str, columns: Sequence[str], row_start: int, num_rows: int) -> pa.Table:
    """Rows [row_start, row_start + num_rows) of ``columns``, reading only the row groups they
    overlap (the last groups read are cached, as consecutive batches often share them)."""
    pf = open_parquet(path)
    md = pf.metadata
    sizes = np.array([md.row_group(i).num_rows for i in range(md.num_row_groups)], np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    lo = int(np.searchsorted(starts, row_start, side="right")) - 1
    hi = int(np.searchsorted(starts, row_start + num_rows, side="left"))
    groups = tuple(range(max(lo, 0), max(hi, lo + 1)))
    key = (path, tuple(columns))
    cached = _LAST.get(key)
    if cached is not None and cached[0] == groups:
        table = cached[1]
    else:
        try:
            table = pf.read_row_groups(list(groups), columns=list(columns))
        except (pa.ArrowException, OSError) as e:
            raise DataError(f"{path}: cannot read row groups {groups} ({e})") from e
        _LAST[key] = (groups, table)
    return table.slice(row_start - int(starts[groups[0]]), num_rows)


def arrow_kind(t: pa.DataType) -> str | None:
    """The column kind of an Arrow type (None: unsupported)."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return INT
    if pa.types.is_floating(t):
        return FLOAT
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return STRING
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = arrow_kind(t.value_type)
        return {INT: LIST_INT, FLOAT: LIST_FLOAT, STRING: LIST_STRING}.get(inner or "")
    return None


def _np(arr: pa.Array, dtype: Any, fill: Any) -> np.ndarray:
    return np.asarray(arr.cast(dtype).fill_null(fill).to_numpy(zero_copy_only=False))


def arrow_to_column(arr: pa.Array | pa.ChunkedArray, name: str) -> tuple[Column, np.ndarray]:
    """(Column, bad rows) of one Arrow column (a null element inside a list is a bad row)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    kind = arrow_kind(arr.type)
    n = len(arr)
    no_bad = np.zeros(n, np.bool_)
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), np.bool_)
    if kind == INT:
        if pa.types.is_uint64(arr.type):
            raise DataError(f"column {name}: uint64 values are not supported, use int64")
        return Column(INT, _np(arr, pa.int64(), 0), None if valid.all() else valid), no_bad
    if kind == FLOAT:
        v = _np(arr, pa.float64(), np.nan)
        pres = valid & ~np.isnan(v)
        return Column(FLOAT, np.where(pres, v, 0.0), None if pres.all() else pres), no_bad
    if kind == STRING:
        return from_arrow_strings(arr), no_bad
    if kind in (LIST_INT, LIST_FLOAT, LIST_STRING):
        lengths = np.asarray(arr.value_lengths().fill_null(0).to_numpy(zero_copy_only=False), np.int64)
        flat = arr.flatten()
        el_valid = np.asarray(flat.is_valid().to_numpy(zero_copy_only=False), np.bool_)
        bad = no_bad
        if not el_valid.all():
            row_of = np.repeat(np.arange(n), lengths)
            bad = np.zeros(n, np.bool_)
            bad[row_of[~el_valid]] = True
        if kind == LIST_STRING:
            return from_arrow_strings(flat, lengths), bad
        dt, fill = (pa.int64(), 0) if kind == LIST_INT else (pa.float64(), 0.0)
        return Column(kind, _np(flat, dt, fill), None, lengths), bad
    raise DataError(f"column {name} has unsupported type {arr.type}")


class ParquetRawSource:
    """Any columns of a Parquet file: ints, floats, strings (nullable) and lists of them.

    ``label``: the label column (0/1, or mapped to 0/1 by a ``LabelConfig``; bad or null is a
    bad record), or None for zero labels.
    ``columns``: the columns to read (default: all but the label and ``exclude``).
    """

    def __init__(self, path: str | Path, batch_size: int, split: Split = "train",
                 eval_fraction: float = 0.2, on_bad_record: OnBadRecord = "fail",
                 label: str | LabelConfig | None = "label", columns: Sequence[str] | None = None,
                 exclude: Sequence[str] = (), rows: np.ndarray | None = None,
                 shuffle: ShuffleConfig | None = None) -> None:
        self.label_rule = None if label is None else as_label(label)
        label = None if label is None else self.label_rule.column  # type: ignore[union-attr]
        _check_common(batch_size, on_bad_record)
        self.path = str(path)
        pf = open_parquet(self.path)
        schema = pf.schema_arrow
        if label is not None and label not in schema.names:
            raise DataError(f"{self.path}: Parquet file lacks the label column '{label}'")
        unknown = [c for c in exclude if c not in schema.names]
        if unknown:
            raise DataError(f"{self.path}: data.columns names columns the file lacks: "
                            f"{', '.join(unknown)} (columns: {', '.join(schema.names)})")
        names = ([c for c in schema.names if c != label and c not in exclude]
                 if columns is None else list(columns))
        self.columns: dict[str, ColumnKind] = {}
        for c in names:
            if c not in schema.names:
                raise DataError(f"{self.path}: Parquet file lacks column '{c}'")
            kind = arrow_kind(schema.field(c).type)
            if kind is None:
                raise DataError(f"{self.path}: column {c} has unsupported type {schema.field(c).type}")
            self.columns[c] = kind
        self.label = label
        self.batch_size = batch_size
        self.split: Split = split
        self.eval_fraction = eval_fraction
        self.on_bad_record: OnBadRecord = on_bad_record
        self.total_rows = pf.metadata.num_rows
        self.names: list[str] = list(schema.names)  # every column of the file
        # the split's rows: a range (the last eval_fraction evaluate), or ``rows`` (data.split)
        self.rows = None if rows is None else np.asarray(rows, np.int64)
        if self.rows is None:
            self.row_start, self.num_rows = split_range(self.total_rows, eval_fraction, split)
        else:
            self.row_start, self.num_rows = 0, len(self.rows)
        self.shuffle = shuffle if split == "train" else None
        if self.shuffle is not None and self.rows is None:
            self.rows = np.arange(self.row_start, self.row_start + self.num_rows, dtype=np.int64)

    @property
    def num_batches(self) -> int:
        return num_batches(self.num_rows, self.batch_size)

    def tasks(self, start_batch: int = 0) -> Iterator[RowsTask]:
        if self.rows is None:
            for lo, n, i in row_batches(self.num_rows, self.batch_size, start_batch):
                yield RowsTask(self.path, self.row_start + lo, n, i)
            return
        if self.shuffle is not None:
            batches = shuffled_batches(0, self.num_rows, self.batch_size, self.shuffle,
                                       start_batch)
        else:
            batches = ((i, np.arange(lo, lo + n)) for lo, n, i in
                       row_batches(self.num_rows, self.batch_size, start_batch))
        for i, take in batches:  # the span of the batch's rows is read, its rows taken
            keep = self.rows[take]
            first = int(keep.min())
            yield RowsTask(self.path, first, int(keep.max()) + 1 - first, i, keep)

    def build_raw(self, task: RowsTask, columns: Sequence[str] | None = None) -> RawBatch:
        """The RawBatch of one task (``columns``: only these, default all of ``self.columns``)."""
        return self.build_rows(task, columns)[0]

    def build_rows(self, task: RowsTask, columns: Sequence[str] | None = None
                   ) -> tuple[RawBatch, np.ndarray]:
        """The RawBatch of one task and the file row of each of its rows."""
        names = list(self.columns) if columns is None else list(columns)
        read = names + ([self.label] if self.label is not None else [])
        table = read_parquet_rows(task.path, read, task.row_start, task.num_rows)
        row_of = np.arange(task.row_start, task.row_start + table.num_rows, dtype=np.int64)
        if task.keep is not None:
            table, row_of = table.take(pa.array(task.keep - task.row_start)), task.keep
        n = table.num_rows
        bad_any = np.zeros(n, np.bool_)
        firsts: list[tuple[str, np.ndarray]] = []
        if self.label is not None:
            try:
                labels, bad = label_map.arrow_labels(table.column(self.label).combine_chunks(),
                                                     self.label_rule)
            except DataError as e:
                raise DataError(f"{task.path}: {e}") from None
            firsts.append((self.label, bad))
        else:
            labels = np.zeros(n, np.float32)
        cols: dict[str, Column] = {}
        for c in names:
            cols[c], bad = arrow_to_column(table.column(c), c)
            firsts.append((c, bad))
        for _, b in firsts:
            bad_any |= b
        n_bad = int(bad_any.sum())
        if n_bad:
            if self.on_bad_record == "fail":
                r = int(np.flatnonzero(bad_any)[0])
                col = next(c for c, b in firsts if b[r])
                what = "bad label" if col == self.label else "null element in list column"
                hint = (label_map.bad_label_hint(self.label_rule)  # type: ignore[arg-type]
                        if col == self.label else "")
                value = table.column(col)[r].as_py()
                raise DataError(f"{task.path}: row {int(row_of[r])} (0-based): {what} {col} "
                                f"{value!r}{hint}")
            keep = ~bad_any
            labels, row_of = labels[keep], row_of[keep]
            cols = {c: col.filter(keep) for c, col in cols.items()}
        return RawBatch(cols, labels, task.index, n_bad, f"{task.path}: "), row_of


def open_source(
    path: str | Path, batch_size: int, split: Split = "train", eval_fraction: float = 0.2,
    on_bad_record: OnBadRecord = "fail", kind: str | None = None,
) -> CriteoRawSource | ParquetRawSource:
    """A raw source for ``path``: ``kind`` "criteo" or "parquet", or by extension (.parquet / .pq
    -> Parquet, anything else -> Criteo TSV)."""
    p = str(path)
    if kind is None:
        kind = "parquet" if p.endswith((".parquet", ".pq")) else "criteo"
    if kind == "criteo":
        return CriteoRawSource(p, batch_size, split, eval_fraction, on_bad_record)
    if kind == "parquet":
        return ParquetRawSource(p, batch_size, split, eval_fraction, on_bad_record)
    raise ValueError(f"unknown source kind {kind!r} (criteo or parquet)")
