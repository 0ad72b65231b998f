"""``reader: csv``: CSV or TSV files, plain or gzip (one file, a directory or a glob), as a raw
source of typed columns.

- The delimiter is ``data.csv.delimiter``, or sniffed from the first lines (``csv_dialect``).
  The column names come from the first file's header (every file's header must match it; a
  first line that looks like data is refused: ``csv_dialect.header_doubt``), or are
  ``data.csv.names`` (f0, f1, ... by default) without one. The types are inferred from the
  first ``data.csv.infer_rows`` rows by Arrow's CSV reader (``csv_columns.infer``), and
  ``data.schema`` overrides them.
- The main process cuts the files into tasks of ``batch_size`` raw lines (no parsing; a batch
  may span two files); ``build_raw`` parses one task with Arrow's CSV reader, every needed
  column as text, and converts it (``csv_columns``), so a bad cell is one bad record, named by
  ``file:line`` and its column, or dropped and counted with ``on_bad_record: skip``. Columns
  neither the label nor needed are not converted.
- A split's rows (``data.split``) and shuffled rows (``data.shuffle``) are cut the same way:
  the main process reads each window of lines once and gives every batch exactly its own lines,
  in its order.
- A quoted value may not hold a newline: tasks are cut at newlines (as for Criteo's TSV).
"""

from __future__ import annotations

import glob
import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from cosparse.config import CsvConfig, LabelConfig, ShuffleConfig
from cosparse.config.labels import as_label
from cosparse.data.errors import DataError, DataLayoutError, empty_split_message
from cosparse.data.lines import LineBlock, count_lines, line_chunks
from cosparse.data.shuffle import shuffled_batches, window_batches
from cosparse.data.split import Split, num_batches, row_batches, split_range
from cosparse.features import csv_columns as CC
from cosparse.features import csv_dialect, label_map
from cosparse.features.types import Column, ColumnKind, RawBatch

OnBadRecord = Literal["fail", "skip"]


def resolve_files(path: str) -> list[str]:
    """The files of ``path``: itself, a directory's files (sorted, hidden ones left out), or
    a glob's matches (sorted). None is a DataError naming the path."""
    p = Path(path)
    if p.is_file():
        return [str(p)]
    if p.is_dir():
        files = sorted(str(f) for f in p.iterdir() if f.is_file() and not f.name.startswith("."))
    else:
        files = sorted(f for f in glob.glob(path) if Path(f).is_file())
    if not files:
        raise DataError(f"{path}: no data file there (a file, a directory of files or a glob)")
    return files


_first_lines = csv_dialect.first_lines


@dataclass(frozen=True)
class CsvPart:
    """Raw bytes of ``num_lines`` lines of one file, from 1-based line ``first_line``."""

    path: str
    first_line: int
    num_lines: int
    data: bytes


@dataclass(frozen=True)
class CsvTask:
    """One batch: its lines, in one file or across two or more (``keep`` None: the parts'
    consecutive lines), or one part of the lines of the global rows ``keep``, in that order
    (a split's rows, or shuffled ones)."""

    parts: tuple[CsvPart, ...]
    index: int
    keep: np.ndarray | None = None


class CsvRawSource:
    """The columns of CSV files (see the module docstring). ``label``: the label column (by name,
    or with its mapping to 0/1), or None (zero labels); ``exclude``: columns never converted
    (``data.columns.drop``)."""

    def __init__(self, path: str | Path, batch_size: int, split: Split = "train",
                 eval_fraction: float = 0.2, on_bad_record: OnBadRecord = "fail",
                 csv: CsvConfig | None = None, schema: dict[str, str] | None = None,
                 label: str | LabelConfig | None = "label", exclude: Sequence[str] = (),
                 rows: np.ndarray | None = None, shuffle: ShuffleConfig | None = None) -> None:
        self.label_rule = None if label is None else as_label(label)
        label = None if label is None else self.label_rule.column  # type: ignore[union-attr]
        if batch_size <= 0:
            raise ValueError("batch_size must be positive")
        self.path = str(path)
        self.csv = csv = csv or CsvConfig()
        self.files = resolve_files(self.path)
        self.delimiter, self.delimiter_note = csv_dialect.pick_delimiter(self.files[0], csv)
        self.header_lines = 1 if csv.header else 0
        self.names = self._names()
        self.types = self._types(schema or {})
        if label is not None and label not in self.names:
            numbers = csv.header and any(map(csv_dialect.is_number, self.names))
            raise DataError(f"{self.files[0]}: no label column '{label}' (columns: "
                            f"{', '.join(self.names)}; set data.columns.label" + (
                                f"; {csv_dialect.no_header_advice(len(self.names))})"
                                if numbers else ")"))
        unknown = [c for c in exclude if c not in self.names]
        if unknown:
            raise DataError(f"{self.files[0]}: data.columns names columns the file lacks: "
                            f"{', '.join(unknown)} (columns: {', '.join(self.names)})")
        self.label = label
        self.columns: dict[str, ColumnKind] = {
            c: CC.KIND_OF[self.types[c]] for c in self.names if c != label and c not in exclude}
        self.batch_size = batch_size
        self.split: Split = split
        self.eval_fraction = eval_fraction
        self.on_bad_record: OnBadRecord = on_bad_record
        self.file_rows = [max(count_lines(f) - self.header_lines, 0) for f in self.files]
        self.row_starts = np.cumsum([0, *self.file_rows[:-1]]).astype(np.int64)
        self.file_offset = dict(zip(self.files, self.row_starts.tolist(), strict=True))
        self.total_rows = total = sum(self.file_rows)
        if total == 0:
            raise DataLayoutError(f"{self.path}: a header line and no rows: nothing to read")
        # the split's rows: a range (the last eval_fraction evaluate), or ``rows`` (data.split)
        self.rows = None if rows is None else np.asarray(rows, np.int64)
        if self.rows is None:
            self.row_start, self.num_rows = split_range(total, eval_fraction, split)
        else:
            self.row_start, self.num_rows = 0, len(self.rows)
        if split == "train" and self.num_rows == 0:
            raise DataError(empty_split_message(self.path, total, "rows", eval_fraction))
        self.shuffle = shuffle if split == "train" else None
        if self.shuffle is not None and self.rows is None:
            self.rows = np.arange(self.row_start, self.row_start + self.num_rows, dtype=np.int64)

    # --- the layout, read once in the main process ------------------------------------------
    def _read(self, data: bytes, names: list[str] | None, types: dict[str, Any] | None = None,
              handler: Any = None, include: Sequence[str] | None = None) -> pa.Table:
        c = self.csv
        return pacsv.read_csv(
            io.BytesIO(data),
            read_options=pacsv.ReadOptions(column_names=names, use_threads=False,
                                           autogenerate_column_names=names is None
                                           and not c.header),
            parse_options=pacsv.ParseOptions(delimiter=self.delimiter,
                                             quote_char=c.quote if c.quote else False,
                                             ignore_empty_lines=False,
                                             invalid_row_handler=handler),
            convert_options=pacsv.ConvertOptions(
                column_types=types, include_columns=include, null_values=list(c.null_values),
                strings_can_be_null=True, quoted_strings_can_be_null=True,
                timestamp_parsers=[]))

    def _names(self) -> list[str]:
        first = _first_lines(self.files[0], 1)
        if not first.strip():
            raise DataLayoutError(f"{self.files[0]}: the file is empty (no header, no rows)"
                                  if not first else f"{self.files[0]}: line 1 is blank")
        if not self.csv.header:
            count = self._read(first, None).num_columns
            names = self.csv.names
            if names is not None and len(names) != count:
                raise DataLayoutError(f"{self.files[0]}: {count} columns on line 1, but "
                                      f"data.csv.names names {len(names)}")
            return list(names) if names is not None else [f"f{i}" for i in range(count)]
        headers = [first] + [_first_lines(f, 1) for f in self.files[1:]]
        for f, h in zip(self.files[1:], headers[1:], strict=True):
            if h.rstrip(b"\r\n") != headers[0].rstrip(b"\r\n"):
                raise DataError(f"{f}: its header differs from {self.files[0]}'s")
        names = self._read(headers[0] + b"\n" if headers[0] else b"", None).column_names
        doubt = csv_dialect.header_doubt(self.files[0], names)
        if doubt:
            raise DataLayoutError(doubt)
        return names

    def _types(self, schema: dict[str, str]) -> dict[str, str]:
        unknown = [c for c in schema if c not in self.names]
        if unknown:
            raise DataError(f"{self.files[0]}: data.schema names columns the file lacks: "
                            f"{', '.join(unknown)} (columns: {', '.join(self.names)})")
        sample = _first_lines(self.files[0], self.csv.infer_rows + self.header_lines)
        if self.header_lines:
            sample = sample.split(b"\n", 1)[1] if b"\n" in sample else b""
        inferred: dict[str, str] = {}
        if sample.strip():
            try:
                table = self._read(sample, self.names, handler=lambda row: "skip")
            except pa.ArrowInvalid as e:
                raise DataError(f"{self.files[0]}: cannot infer the column types ({e}); "
                                "set data.schema") from e
            text = self._read(sample, self.names, {c: pa.large_string() for c in self.names},
                              handler=lambda row: "skip")
            inferred = {c: CC.infer(table.schema.field(c).type, text.column(c).combine_chunks())
                        for c in self.names}
        return {c: schema.get(c) or inferred.get(c, "string") for c in self.names}

    # --- tasks ---------------------------------------------------------------------------------
    @property
    def num_batches(self) -> int:
        return num_batches(self.num_rows, self.batch_size)

    def _pieces(self, lo: int, hi: int, bs: int | None = None) -> Iterator[CsvPart]:
        """Parts covering global rows [lo, hi), cut at every ``bs`` (default: batch) boundary
        counted from lo, and where a file ends."""
        bs, off = bs or self.batch_size, 0
        for f, n in zip(self.files, self.file_rows, strict=True):
            a, b = max(lo, off), min(hi, off + n)
            if a < b:
                line = a - off + 1 + self.header_lines
                head = min(b - a, bs - (a - lo) % bs)
                yield from (CsvPart(f, ln, k, d) for ln, k, d in line_chunks(f, line, head, head))
                if b - a > head:
                    yield from (CsvPart(f, ln, k, d)
                                for ln, k, d in line_chunks(f, line + head, b - a - head, bs))
            off += n

    def tasks(self, start_batch: int = 0) -> Iterator[CsvTask]:
        if start_batch < 0:
            raise ValueError("start_batch must be >= 0")
        if self.rows is not None:
            yield from self._selected_tasks(start_batch)
            return
        lo = self.row_start + start_batch * self.batch_size
        parts: list[CsvPart] = []
        rows, index = 0, start_batch
        for part in self._pieces(lo, self.row_start + self.num_rows):
            parts.append(part)
            rows += part.num_lines
            if rows >= self.batch_size:
                yield CsvTask(tuple(parts), index)
                parts, rows, index = [], 0, index + 1
        if parts:
            yield CsvTask(tuple(parts), index)

    def line_task(self, first_line: int, num_lines: int, data: bytes, index: int) -> CsvTask:
        """Task ``index``: ``num_lines`` raw lines of this source's one file from 1-based line
        ``first_line`` (a stream cuts the lines of a growing file by byte offset itself)."""
        return CsvTask((CsvPart(self.files[0], first_line, num_lines, data),), index)

    def _selected_tasks(self, start_batch: int) -> Iterator[CsvTask]:
        """Batches of ``batch_size`` of the split's rows (shuffled within windows with
        ``data.shuffle``). Each window's lines, from its first row to its last (the rows between
        of the other side included), are read once, in one pass over the files, and every batch
        takes its own lines out of them, in its order."""
        assert self.rows is not None
        bs, rows = self.batch_size, self.rows
        per = window_batches(self.shuffle.buffer, bs) if self.shuffle is not None else 1
        first_window = start_batch // per
        spans = [(int(rows[lo]), int(rows[min(lo + per * bs, len(rows)) - 1]) + 1)
                 for lo in range(first_window * per * bs, len(rows), per * bs)]
        blocks = self._span_blocks(spans)
        block, span_lo = LineBlock([]), -1
        if self.shuffle is not None:
            batches = shuffled_batches(0, len(rows), bs, self.shuffle, start_batch)
        else:
            batches = ((i, np.arange(lo, lo + n)) for lo, n, i in
                       row_batches(len(rows), bs, start_batch))
        for i, take in batches:
            w = i // per - first_window
            if spans[w][0] != span_lo:
                block, span_lo = next(blocks), spans[w][0]
            keep = rows[take]
            path = self._where(int(keep[0]))[0]
            yield CsvTask((CsvPart(path, 0, len(keep), block.take(keep - span_lo)),), i, keep)

    def _span_blocks(self, spans: list[tuple[int, int]]) -> Iterator[LineBlock]:
        """The lines of each of ``spans`` (global row ranges, ascending, not overlapping), from
        one pass over the files from the first span's start."""
        if not spans:
            return
        pending: list[bytes] = []
        j = 0  # the span being filled
        for part in self._pieces(spans[0][0], spans[-1][1], 8192):
            lo = self._row0(part)
            hi = lo + part.num_lines
            ends = np.flatnonzero(np.frombuffer(part.data, np.uint8) == 10) + 1
            while j < len(spans) and spans[j][0] < hi:
                a, b = max(spans[j][0], lo), min(spans[j][1], hi)
                if a < b:
                    start = 0 if a == lo else int(ends[a - lo - 1])
                    stop = len(part.data) if b - lo > len(ends) - 1 else int(ends[b - lo - 1])
                    pending.append(part.data[start:stop])
                if spans[j][1] > hi:
                    break  # the span goes on in the next part
                yield LineBlock(pending)
                pending, j = [], j + 1

    def _row0(self, part: CsvPart) -> int:
        """The global row of a file part's first line."""
        return self.file_offset[part.path] + part.first_line - self.header_lines - 1

    def _where(self, row: int) -> tuple[str, int]:
        """(file, 1-based line) of a global row."""
        f = int(np.searchsorted(self.row_starts, row, side="right")) - 1
        return self.files[f], row - int(self.row_starts[f]) + 1 + self.header_lines

    # --- building ------------------------------------------------------------------------------
    def _parse(self, part: CsvPart, include: list[str], rows: np.ndarray
               ) -> tuple[pa.Table, np.ndarray]:
        """(text table, global row of each of its rows) of one part whose lines are the global
        ``rows``; rows of the wrong width are skipped and counted, or a DataError naming the
        line."""
        wrong: list[tuple[int, int]] = []

        def handler(row: Any) -> str:
            wrong.append((int(row.number), int(row.actual_columns)))
            return "skip" if self.on_bad_record == "skip" else "error"

        types = {c: pa.large_string() for c in include}
        try:
            table = self._read(part.data, self.names, types, handler, include)
        except pa.ArrowInvalid as e:
            if wrong:
                number, got = wrong[0]
                path, line = self._where(int(rows[number - 1]))
                raise DataError(f"{path}:{line}: wrong column count: expected "
                                f"{len(self.names)} got {got}") from None
            (p0, l0), (p1, l1) = self._where(int(rows.min())), self._where(int(rows.max()))
            raise DataError(f"{p0}:{l0} .. {p1}:{l1}: cannot parse ({e})") from e
        if wrong:
            rows = np.delete(rows, [n - 1 for n, _ in wrong])
        return table, rows

    def build_raw(self, task: CsvTask, columns: Sequence[str] | None = None) -> RawBatch:
        """The RawBatch of one task (``columns``: only these, default all of ``self.columns``)."""
        return self.build_rows(task, columns)[0]

    def build_rows(self, task: CsvTask, columns: Sequence[str] | None = None
                   ) -> tuple[RawBatch, np.ndarray]:
        """The RawBatch of one task and the global row number of each of its rows."""
        names = list(self.columns) if columns is None else list(columns)
        include = names + ([self.label] if self.label is not None else [])
        tables, row_parts = [], []
        for part in task.parts:
            lines = (task.keep if task.keep is not None
                     else self._row0(part) + np.arange(part.num_lines, dtype=np.int64))
            t, r = self._parse(part, include, lines)
            tables.append(t)
            row_parts.append(r)
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        row_of = np.concatenate(row_parts)
        wanted = sum(p.num_lines for p in task.parts)
        skipped = wanted - table.num_rows
        n = table.num_rows
        firsts: list[tuple[str, np.ndarray]] = []
        if self.label is not None:
            labels, bad = label_map.text_labels(table.column(self.label).combine_chunks(),
                                                self.label_rule, self.types[self.label])
            firsts.append((self.label, bad))
        else:
            labels = np.zeros(n, np.float32)
        cols: dict[str, Column] = {}
        for c in names:
            cols[c], bad = CC.convert(table.column(c).combine_chunks(), self.types[c],
                                      self.csv.list_separator)
            firsts.append((c, bad))
        bad_any = np.zeros(n, np.bool_)
        for _, b in firsts:
            bad_any |= b
        n_bad = int(bad_any.sum())
        if n_bad and self.on_bad_record == "fail":
            r = int(np.flatnonzero(bad_any)[0])
            col = next(c for c, b in firsts if b[r])
            path, line = self._where(int(row_of[r]))
            hint = label_map.bad_label_hint(self.label_rule) if col == self.label else ""  # type: ignore[arg-type]
            raise DataError(f"{path}:{line}: {self._what(col)} {table.column(col)[r].as_py()!r}"
                            f"{hint}")
        if n_bad:
            keep = ~bad_any
            labels, row_of = labels[keep], row_of[keep]
            cols = {c: col.filter(keep) for c, col in cols.items()}
        source = task.parts[0].path if task.parts else self.path
        return RawBatch(cols, labels, task.index, n_bad + skipped, f"{source}: "), row_of

    def _what(self, col: str) -> str:
        if col == self.label:
            return f"bad label in column {col} ({label_map.bad_label_note(self.label_rule)}):"
        t = self.types[col]
        hint = (f" (set data.schema: {{{col}: uint64}} or string)" if t == "int64"
                else f" (set data.schema: {{{col}: string}})" if t != "string" else "")
        return f"column {col} is {t}{hint}, got"
