"""Criteo TSV reader: ``label \\t I1..I13 \\t C1..C26`` lines, plain or gzip, parsed by numba.

The main process cuts the file into tasks of ``batch_size`` raw lines (no parsing); ``build`` parses
one task with ``kernels.parse_criteo_chunk`` and returns a SparseBatch with keys C1..C26 and 13 dense
features. A bad line raises DataError naming ``file:line`` (``on_bad_record="fail"``) or is dropped
and counted in ``SparseBatch.bad_records`` (``"skip"``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from cosparse.batch import SparseBatch
from cosparse.config import ShuffleConfig
from cosparse.data import kernels as K
from cosparse.data.columns import CRITEO_KEYS, NUM_DENSE, columns_to_batch
from cosparse.data.errors import DataError, empty_split_message
from cosparse.data.lines import LineBlock, count_lines, line_chunks
from cosparse.data.shuffle import shuffled_batches, window_batches
from cosparse.data.split import Split, num_batches, split_range

OnBadRecord = Literal["fail", "skip"]


@dataclass(frozen=True)
class CriteoTask:
    """Raw bytes of ``num_lines`` consecutive lines starting at 1-based ``first_line``, or of
    the lines ``lines`` (1-based, in the order of ``data``) when they are shuffled."""

    path: str
    first_line: int
    num_lines: int
    data: bytes
    index: int
    lines: np.ndarray | None = None

    def line_no(self, i: int) -> int:
        """The file line of the task's ``i``-th line (0-based)."""
        return self.first_line + i if self.lines is None else int(self.lines[i])


def _column_name(col: int) -> str:
    if col == 0:
        return "label"
    if col <= K.NUM_INT:
        return f"I{col}"
    return f"C{col - K.NUM_INT}"


def _field_text(data: bytes, line_in_chunk: int, col: int) -> str:
    """Text of one field of one line of a chunk (error path only)."""
    line = data.split(b"\n")[line_in_chunk].rstrip(b"\r")
    fields = line.split(b"\t")
    text = fields[col].decode("utf-8", "replace") if col < len(fields) else ""
    return text if len(text) <= 40 else text[:37] + "..."


def describe_bad_line(
    path: str, line_no: int, data: bytes, line_in_chunk: int, code: int, col: int, ncols: int
) -> str:
    """The DataError message for a bad line: ``path:line: what was wrong``."""
    where = f"{path}:{line_no}"
    if code == K.ERR_COLUMNS:
        return f"{where}: wrong column count: expected {K.NUM_COLS} got {ncols}"
    name = _column_name(col)
    text = _field_text(data, line_in_chunk, col)
    if code == K.ERR_LABEL:
        return f"{where}: bad label {text!r} (expected 0 or 1)"
    if code == K.ERR_INT:
        return f"{where}: non-numeric integer field {name} {text!r}"
    if code == K.ERR_INT_RANGE:
        return f"{where}: integer field {name} {text!r} is out of range (over 18 digits)"
    if code == K.ERR_CAT:
        return f"{where}: non-hex categorical field {name} {text!r}"
    if code == K.ERR_CAT_RANGE:
        return f"{where}: categorical field {name} {text!r} does not fit a non-negative int64"
    return f"{where}: malformed line (error code {code})"


class CriteoTSVReader:
    """Reads one split of a Criteo TSV file (``.gz`` or plain) in batches of ``batch_size`` lines."""

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
        if not Path(self.path).is_file():
            raise DataError(f"{self.path}: data file not found")
        self.batch_size = batch_size
        self.split: Split = split
        self.eval_fraction = eval_fraction
        self.on_bad_record: OnBadRecord = on_bad_record
        self.shuffle = shuffle if split == "train" else None
        self.keys: list[str] = list(CRITEO_KEYS)
        self.num_dense: int = NUM_DENSE
        self._range: tuple[int, int] | None = None

    def line_range(self) -> tuple[int, int]:
        """(first line, 1-based; line count) of this split. Counts the file's lines once. An
        empty training split (an empty file) is a DataError naming the file."""
        if self._range is None:
            total = count_lines(self.path)
            start, count = split_range(total, self.eval_fraction, self.split)
            if self.split == "train" and count == 0:
                raise DataError(empty_split_message(self.path, total, "lines", self.eval_fraction))
            self._range = (start + 1, count)
        return self._range

    @property
    def num_batches(self) -> int:
        return num_batches(self.line_range()[1], self.batch_size)

    def tasks(self, start_batch: int = 0) -> Iterator[CriteoTask]:
        """Tasks of ``batch_size`` raw lines in order, from batch ``start_batch`` on."""
        if start_batch < 0:
            raise ValueError("start_batch must be >= 0")
        first, count = self.line_range()
        if self.shuffle is not None:
            yield from self._shuffled_tasks(first, count, start_batch)
            return
        skip = start_batch * self.batch_size
        if skip >= count:
            return
        chunks = line_chunks(self.path, first + skip, count - skip, self.batch_size)
        for i, (line_no, n, data) in enumerate(chunks):
            yield CriteoTask(self.path, line_no, n, data, start_batch + i)

    def _shuffled_tasks(self, first: int, count: int, start_batch: int) -> Iterator[CriteoTask]:
        """The batches of ``data.shuffle``: each window of lines is read once and its lines are
        dealt out to the window's batches in the window's permuted order."""
        assert self.shuffle is not None
        bs = self.batch_size
        rows = window_batches(self.shuffle.buffer, bs) * bs
        skip = start_batch // (rows // bs) * rows
        windows = line_chunks(self.path, first + skip, count - skip, rows)
        block, block_first, block_lo = LineBlock([]), first, -1
        for i, take in shuffled_batches(0, count, bs, self.shuffle, start_batch):
            lo = int(take.min()) // rows * rows
            if lo != block_lo:  # the next window: read its lines once
                block_first, _, data = next(windows)
                block, block_lo = LineBlock([data]), lo
            sel = take - lo
            yield CriteoTask(self.path, block_first, len(sel), block.take(sel), i,
                             block_first + sel)

    def build(self, task: CriteoTask) -> SparseBatch:
        """Parse one task into a SparseBatch (pure; safe in a worker process)."""
        buf = np.frombuffer(task.data, np.uint8)
        labels, ints, ipres, cats, cpres, err, err_col, ncols = K.parse_criteo_chunk(
            buf, task.num_lines
        )
        keep = err == K.ERR_OK
        bad = int(task.num_lines - np.count_nonzero(keep))
        if bad and self.on_bad_record == "fail":
            li = int(np.flatnonzero(~keep)[0])
            raise DataError(
                describe_bad_line(
                    task.path, task.line_no(li), task.data, li,
                    int(err[li]), int(err_col[li]), int(ncols[li]),
                )
            )
        return columns_to_batch(
            self.keys, labels, ints, ipres, cats, cpres,
            keep=keep if bad else None, bad_records=bad, index=task.index,
        )
