"""Parquet reader with the Criteo columns (label, I1..I13, C1..C26), vectorised with pyarrow/numba.

``label``: integer, float or bool, 0 or 1. ``I*``: nullable integers (float columns must hold whole
numbers; string columns decimal text). ``C*``: nullable hex strings or non-negative int64; a null
or empty string is a missing value, i.e. an empty bag. Only a null is missing in a float column: a
NaN or an infinity is a bad value, like 1.5. A bad value raises DataError naming the file, the row
(0-based) and the column, or is dropped and counted with ``on_bad_record="skip"``. A column of an
unsupported type is a DataError naming the file and the column.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from cosparse.batch import SparseBatch
from cosparse.config import ShuffleConfig
from cosparse.data import kernels as K
from cosparse.data.columns import CRITEO_DENSE, CRITEO_KEYS, NUM_DENSE, columns_to_batch
from cosparse.data.errors import DataError, empty_split_message
from cosparse.data.lines import open_binary
from cosparse.data.shuffle import shuffled_batches
from cosparse.data.split import Split, num_batches, row_batches, split_range

OnBadRecord = Literal["fail", "skip"]
COLUMNS: list[str] = ["label", *CRITEO_DENSE, *CRITEO_KEYS]


@dataclass(frozen=True)
class ParquetTask:
    """Rows ``row_start .. row_start + num_rows - 1`` (0-based) of a Parquet file, or the rows
    ``take`` among them, in that order (``data.shuffle``)."""

    path: str
    row_start: int
    num_rows: int
    index: int
    take: np.ndarray | None = None


# --- per-process caches: the open file and the last row groups read ---------------------------
_FILES: dict[str, tuple[tuple[int, int], pq.ParquetFile]] = {}
_LAST_READ: dict[str, tuple[tuple[int, ...], pa.Table]] = {}


def _open(path: str) -> pq.ParquetFile:
    try:
        st = os.stat(path)
    except OSError:
        raise DataError(f"{path}: data file not found") from None
    stamp = (st.st_size, st.st_mtime_ns)
    cached = _FILES.get(path)
    pf = cached[1] if cached is not None and cached[0] == stamp else None
    if pf is None:
        _LAST_READ.pop(path, None)
        try:  # (a corrupt footer can fail in Arrow, or in decoding its column names)
            pf = pq.ParquetFile(path)
            names = pf.schema_arrow.names
            md = pf.metadata
            sizes = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
        except (pa.ArrowException, OSError, ValueError) as e:
            raise DataError(f"{path}: cannot read as Parquet ({e})") from e
        if min(sizes, default=0) < 0 or sum(sizes) != md.num_rows:
            raise DataError(f"{path}: cannot read as Parquet (corrupt metadata: {md.num_rows} "
                            f"rows, row groups of {sizes[:8]} rows)")
        missing = [c for c in COLUMNS if c not in names]
        if missing:
            raise DataError(f"{path}: Parquet file lacks columns {', '.join(missing)}")
        _FILES[path] = (stamp, pf)
    return pf


def read_rows(path: str, row_start: int, num_rows: int) -> pa.Table:
    """Rows [row_start, row_start + num_rows) of the Criteo columns, reading only the row groups
    they overlap (the last ones read are cached, as consecutive batches often share them)."""
    pf = _open(path)
    md = pf.metadata
    sizes = np.array([md.row_group(i).num_rows for i in range(md.num_row_groups)], np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    lo = int(np.searchsorted(starts, row_start, side="right")) - 1
    hi = int(np.searchsorted(starts, row_start + num_rows, side="left"))
    groups = tuple(range(max(lo, 0), max(hi, lo + 1)))
    cached = _LAST_READ.get(path)
    if cached is not None and cached[0] == groups:
        table = cached[1]
    else:
        try:
            table = pf.read_row_groups(list(groups), columns=COLUMNS)
        except (pa.ArrowException, OSError, ValueError) as e:
            raise DataError(f"{path}: cannot read row groups {groups} ({e})") from e
        _LAST_READ[path] = (groups, table)
    return table.slice(row_start - int(starts[groups[0]]), num_rows)


# --- column conversion ---------------------------------------------------------------------------
def _column(table: pa.Table, name: str) -> pa.Array:
    col = table.column(name).combine_chunks()
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    return col


def _valid(arr: pa.Array) -> np.ndarray:
    return np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=np.bool_)


_INT_LIMIT = 10**18  # integer fields have at most 18 digits


def _unsupported(path: str, name: str, t: pa.DataType) -> DataError:
    return DataError(f"{path}: column {name} has unsupported type {t}")


def _labels(arr: pa.Array, path: str) -> tuple[np.ndarray, np.ndarray]:
    """(labels float32, bad rows)."""
    t = arr.type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
        raise _unsupported(path, "label", t)
    valid = _valid(arr)
    # unsafe: a huge integer need not be exact as a float, only 0 and 1 are labels
    v = np.asarray(arr.cast(pa.float64(), safe=False).fill_null(-1.0)
                   .to_numpy(zero_copy_only=False))
    bad = ~valid | ((v != 0.0) & (v != 1.0))
    return np.where(bad, 0.0, v).astype(np.float32), bad


def _ints(arr: pa.Array, name: str, path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values int64, present, bad rows) of one integer column. In a float column a null is
    missing, and a NaN, an infinity or a fraction is bad. A value of 19 or more digits is out
    of range, as in the TSV reader."""
    t = arr.type
    valid = _valid(arr)
    if pa.types.is_integer(t):
        big = np.zeros(len(arr), np.bool_)
        if pa.types.is_uint64(t):  # beyond int64: out of range, not wrapped around
            big = np.asarray(pc.greater_equal(arr, pa.scalar(_INT_LIMIT, t)).fill_null(False)
                             .to_numpy(zero_copy_only=False), np.bool_)
        v = np.asarray(arr.cast(pa.int64(), safe=False).fill_null(0)
                       .to_numpy(zero_copy_only=False))
        bad = valid & (big | (v >= _INT_LIMIT) | (v <= -_INT_LIMIT))
        return np.where(bad, 0, v), valid & ~bad, bad
    if pa.types.is_floating(t):
        f = np.asarray(arr.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False))
        with np.errstate(invalid="ignore"):
            bad = valid & ~(np.isfinite(f) & (np.floor(f) == f) & (np.abs(f) < _INT_LIMIT))
        v = np.where(valid & ~bad, f, 0.0).astype(np.int64)
        return v, valid & ~bad, bad
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        present = valid & _valid_nonempty(arr)
        ok = np.asarray(
            pc.match_substring_regex(arr, r"^[+-]?[0-9]{1,18}$").fill_null(True)
            .to_numpy(zero_copy_only=False), dtype=np.bool_
        )
        bad = present & ~ok
        clean = pc.if_else(pa.array(present & ok), arr, pa.scalar("0", arr.type))
        v = np.asarray(clean.cast(pa.int64()).to_numpy(zero_copy_only=False))
        return v, present & ok, bad
    raise _unsupported(path, name, t)


def _valid_nonempty(arr: pa.Array) -> np.ndarray:
    lens = pc.binary_length(arr).fill_null(0).to_numpy(zero_copy_only=False)
    return np.asarray(lens, dtype=np.int64) > 0


def _cats(arr: pa.Array, name: str, path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(IDs int64, present, bad rows) of one categorical column."""
    t = arr.type
    valid = _valid(arr)
    if pa.types.is_integer(t):
        if pa.types.is_uint64(t):
            raise DataError(f"{path}: column {name}: uint64 IDs are not supported, use int64")
        v = np.asarray(arr.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False))
        bad = valid & (v < 0)
        return np.where(bad, 0, v), valid & ~bad, bad
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        a = arr.cast(pa.large_string())
        bufs = a.buffers()
        offsets = np.frombuffer(bufs[1], np.int64)[a.offset : a.offset + len(a) + 1]
        data = (
            np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
        )
        values, present, codes = K.parse_hex_strings(offsets, data, valid)
        return values, present, codes != K.ERR_OK
    raise _unsupported(path, name, t)


def _value(table: pa.Table, name: str, row: int) -> object:
    """The value of one cell, for an error message (a string that is not UTF-8: its bytes)."""
    cell = table.column(name)[row]
    try:
        return cell.as_py()
    except UnicodeDecodeError:
        return cell.cast(pa.binary()).as_py()


def _describe(path: str, row: int, name: str, value: object) -> str:
    where = f"{path}: row {row} (0-based)"
    if name == "label":
        return f"{where}: bad label {value!r} (expected 0 or 1)"
    if name.startswith("I"):
        if isinstance(value, float):
            if math.isfinite(value) and value == math.floor(value):
                return f"{where}: integer field {name} {value!r} is out of range (over 18 digits)"
            what = "a whole number" if math.isfinite(value) else "finite"
            return f"{where}: integer field {name} {value!r} is not {what}"
        if isinstance(value, int):
            return f"{where}: integer field {name} {value!r} is out of range (over 18 digits)"
        return f"{where}: non-numeric integer field {name} {value!r}"
    if isinstance(value, int):
        return f"{where}: categorical field {name} {value!r} is negative"
    return f"{where}: non-hex categorical field {name} {value!r}"


def table_to_batch(
    table: pa.Table,
    path: str,
    row_start: int | np.ndarray = 0,
    on_bad_record: OnBadRecord = "fail",
    index: int = 0,
) -> SparseBatch:
    """Convert a table of the Criteo columns (its row 0 is file row ``row_start``, or its rows
    are the file rows ``row_start``)."""
    n = table.num_rows
    bad_any = np.zeros(n, np.bool_)
    bad_cols: list[tuple[str, np.ndarray]] = []
    labels, bad = _labels(_column(table, "label"), path)
    bad_cols.append(("label", bad))
    ints = np.zeros((n, NUM_DENSE), np.int64)
    ipres = np.zeros((n, NUM_DENSE), np.bool_)
    for j, name in enumerate(CRITEO_DENSE):
        ints[:, j], ipres[:, j], bad = _ints(_column(table, name), name, path)
        bad_cols.append((name, bad))
    cats = np.zeros((n, len(CRITEO_KEYS)), np.int64)
    cpres = np.zeros((n, len(CRITEO_KEYS)), np.bool_)
    for j, name in enumerate(CRITEO_KEYS):
        cats[:, j], cpres[:, j], bad = _cats(_column(table, name), name, path)
        bad_cols.append((name, bad))
    for _, bad in bad_cols:
        bad_any |= bad
    n_bad = int(np.count_nonzero(bad_any))
    if n_bad and on_bad_record == "fail":
        r = int(np.flatnonzero(bad_any)[0])
        name = next(nm for nm, bad in bad_cols if bad[r])
        row = row_start + r if isinstance(row_start, int) else int(row_start[r])
        raise DataError(_describe(path, row, name, _value(table, name, r)))
    return columns_to_batch(
        list(CRITEO_KEYS), labels, ints, ipres, cats, cpres,
        keep=~bad_any if n_bad else None, bad_records=n_bad, index=index,
    )


class ParquetReader:
    """Reads one split of a Criteo-column Parquet file in batches of ``batch_size`` rows."""

    def __init__(
        self,
        path: str | Path,
        batch_size: int,
        split: Split = "train",
        eval_fraction: float = 0.2,
        on_bad_record: OnBadRecord = "fail",
        shuffle: ShuffleConfig | None = None,
    ) -> None:
        if batch_size <= 0:
            raise ValueError("batch_size must be positive")
        if on_bad_record not in ("fail", "skip"):
            raise ValueError(f"on_bad_record must be 'fail' or 'skip', got {on_bad_record!r}")
        self.path = str(path)
        pf = _open(self.path)
        self.shuffle = shuffle if split == "train" else None
        self.batch_size = batch_size
        self.split: Split = split
        self.eval_fraction = eval_fraction
        self.on_bad_record: OnBadRecord = on_bad_record
        self.keys: list[str] = list(CRITEO_KEYS)
        self.num_dense: int = NUM_DENSE
        total = pf.metadata.num_rows
        self.row_start, self.num_rows = split_range(total, eval_fraction, split)
        if split == "train" and self.num_rows == 0:
            raise DataError(empty_split_message(self.path, total, "rows", eval_fraction))

    @property
    def num_batches(self) -> int:
        return num_batches(self.num_rows, self.batch_size)

    def tasks(self, start_batch: int = 0) -> Iterator[ParquetTask]:
        if self.shuffle is None:
            for lo, n, i in row_batches(self.num_rows, self.batch_size, start_batch):
                yield ParquetTask(self.path, self.row_start + lo, n, i)
            return
        for i, take in shuffled_batches(self.row_start, self.num_rows, self.batch_size,
                                        self.shuffle, start_batch):
            first = int(take.min())
            yield ParquetTask(self.path, first, int(take.max()) + 1 - first, i, take)

    def build(self, task: ParquetTask) -> SparseBatch:
        table = read_rows(task.path, task.row_start, task.num_rows)
        rows: int | np.ndarray = task.row_start
        if task.take is not None:
            table, rows = table.take(pa.array(task.take - task.row_start)), task.take
        try:
            return table_to_batch(table, task.path, rows, self.on_bad_record, task.index)
        except pa.ArrowException as e:  # corrupt values that Arrow itself cannot convert
            raise DataError(f"{task.path}: rows {task.row_start}..{task.row_start + task.num_rows - 1}"
                            f" (0-based): cannot convert the Criteo columns ({e})") from e


# --- test/helper: TSV -> Parquet ---------------------------------------------------------------
def read_criteo_tsv_table(tsv_path: str | Path, rows: int | None = None) -> pa.Table:
    """A Criteo TSV file (plain or gzip) as an Arrow table: label int8, I* int64, C* strings.

    Parsed by pyarrow's CSV reader, independently of the numba parser.
    """
    types = {"label": pa.int8(), **{c: pa.int64() for c in CRITEO_DENSE}}
    types.update({c: pa.string() for c in CRITEO_KEYS})
    with open_binary(tsv_path) as f:
        table = pacsv.read_csv(
            f,
            read_options=pacsv.ReadOptions(column_names=COLUMNS),
            parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False),
            convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=False),
        )
    return table if rows is None else table.slice(0, rows)


def write_criteo_parquet(
    tsv_path: str | Path,
    out_path: str | Path,
    rows: int | None = None,
    categorical: Literal["hex", "int64"] = "hex",
    row_group_size: int | None = None,
) -> Path:
    """Write the first ``rows`` lines (all when None) of a Criteo TSV file as Parquet.

    ``categorical="hex"`` keeps C* as strings ("" for missing); ``"int64"`` stores the parsed IDs
    with nulls for missing.
    """
    table = read_criteo_tsv_table(tsv_path, rows)
    if categorical == "int64":
        for name in CRITEO_KEYS:
            col = table.column(name).combine_chunks().cast(pa.large_string())
            bufs = col.buffers()
            offsets = np.frombuffer(bufs[1], np.int64)[col.offset : col.offset + len(col) + 1]
            data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
            values, present, codes = K.parse_hex_strings(offsets, data, _valid(col))
            if codes.any():
                raise DataError(f"{tsv_path}: non-hex value in column {name}")
            idx = table.schema.get_field_index(name)
            table = table.set_column(idx, name, pa.array(values, pa.int64(), mask=~present))
    out = Path(out_path)
    pq.write_table(table, out, row_group_size=row_group_size)
    return out
