"""``reader: libsvm``: libSVM / libFM lines (``label idx:val idx:val ...``) and libFFM lines
(``label field:idx:val ...``), plain or gzip (one file, a directory or a glob), as a raw source.

- The label column is ``label`` (the first token of each line), mapped to 0/1 by
  ``data.columns.label`` like any other reader's (``positive`` compared as numbers).
- libSVM/libFM: each token's position on its line is its feature (``f0``, ``f1``, ...: one ID per
  row, missing where a line is shorter), its index the ID. libFFM: the field names the feature
  (``f<field>``: a bag of the indices of that field's tokens on the line).
- The value is the ID's weight in its bag. Bags have no per-ID weights in cosparse (SparseBatch
  carries IDs and bag lengths only), so a value other than 1 is refused, naming its file:line,
  rather than dropped.
- ``data.libsvm.format`` says which lines the files hold, or ``auto`` tells them apart by each
  file's first feature token (one ``:`` or two). The features are found by one vectorised pass
  over the files at start-up (the longest line, or the fields used).

Rows, splits (``data.eval_fraction``, ``data.split``) and shuffles are cut exactly as for
``reader: csv`` (this source is a ``CsvRawSource`` whose lines are parsed here instead): a task's
lines are split into tokens and the tokens at ``:`` with numpy and pyarrow compute over the whole
task, no Python loop per line or token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cosparse.config import CsvConfig, LabelConfig, ShuffleConfig
from cosparse.config.libsvm import LibsvmFormat
from cosparse.data.errors import DataError
from cosparse.data.lines import line_chunks
from cosparse.data.split import Split
from cosparse.features import csv_columns as CC
from cosparse.features import label_map
from cosparse.features.csv_source import CsvRawSource, CsvTask, OnBadRecord
from cosparse.features.types import INT, LIST_INT, Column, RawBatch

LABEL = "label"
_SCAN_LINES = 1 << 16


@dataclass
class Tokens:
    """The lines of one block split into tokens: ``label`` (text, null for an empty line) per
    line; per feature token its line, its key (position on the line, or field), its index and
    value (text); and per line whether a token of it is malformed."""

    label: pa.Array
    line: np.ndarray
    key: np.ndarray
    index: pa.Array
    value: pa.Array
    malformed: np.ndarray


def split_tokens(data: bytes, num_lines: int, fmt: str) -> Tokens:
    """Tokenize ``num_lines`` lines of ``fmt`` (``svm`` or ``ffm``), vectorised."""
    buf = np.frombuffer(data, np.uint8)
    space = (buf == 32) | (buf == 9) | (buf == 10) | (buf == 13)
    starts = np.flatnonzero(~space & np.concatenate([[True], space[:-1]]))
    ends = np.flatnonzero(~space & np.concatenate([space[1:], [True]])) + 1
    line = np.searchsorted(np.flatnonzero(buf == 10), starts).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(ends - starts)]).astype(np.int64)
    tokens = pa.LargeStringArray.from_buffers(len(starts), pa.py_buffer(offsets),
                                              pa.py_buffer(buf[~space].tobytes()))
    first = np.ones(len(starts), np.bool_)
    first[1:] = line[1:] != line[:-1]
    at = np.full(num_lines, -1, np.int64)
    at[line[first]] = np.flatnonzero(first)
    label = tokens.take(pa.array(at, mask=at < 0))
    feat = np.flatnonzero(~first)
    owner = np.maximum.accumulate(np.where(first, np.arange(len(starts)), 0))
    parts = pc.split_pattern(tokens.take(pa.array(feat)), ":")
    counts = np.asarray(parts.value_lengths().to_numpy(zero_copy_only=False), np.int64)
    want = 2 if fmt == "svm" else 3
    good = counts == want
    malformed = np.zeros(num_lines, np.bool_)
    malformed[line[feat[~good]]] = True
    base = np.asarray(parts.offsets.to_numpy(), np.int64)[:-1][good]
    flat = parts.flatten()
    feat = feat[good]
    if fmt == "ffm":  # (a token whose field is not an integer is malformed, and left out)
        field, bad_field = CC.convert(flat.take(pa.array(base)), "int64", "|")
        malformed[line[feat[bad_field]]] = True
        feat, base, key = feat[~bad_field], base[~bad_field], field.values[~bad_field]
    else:
        key = feat - owner[feat] - 1
    index, value = flat.take(pa.array(base + want - 2)), flat.take(pa.array(base + want - 1))
    return Tokens(label, line[feat], key, index, value, malformed)


def detect_format(path: str) -> str:
    """``svm`` or ``ffm`` by the first feature token of ``path`` (one ``:`` or two)."""
    for _, n, data in line_chunks(path, 1, _SCAN_LINES, _SCAN_LINES):
        for text in data.split(b"\n", n)[:n]:
            words = text.split()
            if len(words) > 1:
                colons = words[1].count(b":")
                if colons in (1, 2):
                    return "svm" if colons == 1 else "ffm"
                raise DataError(f"{path}: '{words[1].decode(errors='replace')}' is neither "
                                "idx:val (libSVM/libFM) nor field:idx:val (libFFM); set "
                                "data.libsvm.format")
    raise DataError(f"{path}: no feature token in its first {_SCAN_LINES:,} lines to tell "
                    "libSVM from libFFM lines; set data.libsvm.format")


class LibsvmRawSource(CsvRawSource):
    """The columns of libSVM/libFM/libFFM files (see the module docstring)."""

    def __init__(self, path: str | Path, batch_size: int, split: Split = "train",
                 eval_fraction: float = 0.2, on_bad_record: OnBadRecord = "fail",
                 fmt: LibsvmFormat = "auto", label: str | LabelConfig | None = LABEL,
                 exclude: Sequence[str] = (), rows: np.ndarray | None = None,
                 shuffle: ShuffleConfig | None = None) -> None:
        self.format_setting = fmt
        super().__init__(path, batch_size, split, eval_fraction, on_bad_record,
                         CsvConfig(header=False, quote=None), None, label, exclude, rows, shuffle)

    # --- the layout: one scan of every file at start-up -----------------------------------------
    def _names(self) -> list[str]:
        formats = {f: self.format_setting if self.format_setting != "auto" else detect_format(f)
                   for f in self.files}
        if len(set(formats.values())) > 1:
            svm, ffm = (next(f for f, k in formats.items() if k == x) for x in ("svm", "ffm"))
            raise DataError(f"{svm} holds libSVM lines but {ffm} libFFM lines; read them apart")
        self.format = next(iter(formats.values()))
        keys = np.zeros(0, np.int64)
        for f in self.files:
            for _, n, data in line_chunks(f, 1, 1 << 62, _SCAN_LINES):
                t = split_tokens(data, n, self.format)
                keys = np.union1d(keys, np.unique(t.key)) if self.format == "ffm" else \
                    np.arange(max(len(keys), int(t.key.max(initial=-1)) + 1))
        self.feature_keys = keys
        self.feature_names = [f"f{k}" for k in keys.tolist()]
        return [LABEL, *self.feature_names]

    def _types(self, schema: dict[str, str]) -> dict[str, str]:
        kind = "int64" if self.format == "svm" else "list<int64>"
        return {LABEL: "float32", **{c: kind for c in self.feature_names}}

    # --- building -------------------------------------------------------------------------------
    def build_rows(self, task: CsvTask, columns: Sequence[str] | None = None
                   ) -> tuple[RawBatch, np.ndarray]:
        """The RawBatch of one task and the global row number of each of its rows."""
        names = list(self.columns) if columns is None else list(columns)
        row_of = np.concatenate([
            task.keep if task.keep is not None
            else self._row0(p) + np.arange(p.num_lines, dtype=np.int64) for p in task.parts])
        data = b"".join(p.data if p.data.endswith(b"\n") else p.data + b"\n"
                        for p in task.parts)
        n = len(row_of)
        t = split_tokens(data, n, self.format)
        index, bad_index = CC.convert(t.index, "int64", "|")
        value, bad_value = CC.convert(t.value, "float32", "|")
        malformed = t.malformed.copy()
        malformed[t.line[bad_index | bad_value]] = True
        weighted = ~(bad_index | bad_value) & (value.values != 1.0)
        if weighted.any():
            j = int(np.flatnonzero(weighted)[0])
            path, line = self._where(int(row_of[t.line[j]]))
            raise DataError(f"{path}:{line}: feature value {t.value[j].as_py()} (index "
                            f"{t.index[j].as_py()}): cosparse bags have no per-ID weights, so "
                            "reader libsvm takes one-hot features (value 1) only; values other "
                            "than 1 are refused, not dropped")
        if self.label is not None:
            labels, bad_label = label_map.text_labels(t.label, self.label_rule, "float32")
        else:
            labels, bad_label = np.zeros(n, np.float32), np.zeros(n, np.bool_)
        empty = np.asarray(t.label.is_null().to_numpy(zero_copy_only=False), np.bool_)
        bad = malformed | bad_label | empty
        if bad.any() and self.on_bad_record == "fail":
            r = int(np.flatnonzero(bad)[0])
            path, line = self._where(int(row_of[r]))
            shape = "idx:val" if self.format == "svm" else "field:idx:val"
            what = ("an empty line" if empty[r]
                    else f"a malformed token (expected {shape})" if malformed[r]
                    else f"bad label {t.label[r].as_py()!r} "
                         f"({label_map.bad_label_note(self.label_rule)})"  # type: ignore[arg-type]
                         f"{label_map.bad_label_hint(self.label_rule)}")  # type: ignore[arg-type]
            raise DataError(f"{path}:{line}: {what} (or data.on_bad_record: skip)")
        cols = {c: self._column(c, t, index.values, n) for c in names}
        keep = ~bad
        if bad.any():
            labels, row_of = labels[keep], row_of[keep]
            cols = {c: col.filter(keep) for c, col in cols.items()}
        source = task.parts[0].path if task.parts else self.path
        return RawBatch(cols, labels, task.index, int(bad.sum()), f"{source}: "), row_of

    def _column(self, name: str, t: Tokens, index: np.ndarray, n: int) -> Column:
        """One column of the task: the label (as read), a position's IDs, or a field's bags."""
        if name == LABEL:
            return CC.convert(t.label, "float32", "|")[0]
        key = int(name[1:])
        mine = t.key == key
        if self.format == "svm":
            values, present = np.zeros(n, np.int64), np.zeros(n, np.bool_)
            values[t.line[mine]], present[t.line[mine]] = index[mine], True
            return Column(INT, values, None if present.all() else present)
        return Column(LIST_INT, index[mine], None,
                      np.bincount(t.line[mine], minlength=n).astype(np.int64))
