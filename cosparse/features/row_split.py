"""Train/eval splits of a table's rows (``data.split``), decided once at start-up from the
columns they need, as a mask of the eval rows:

- ``position``: the last ``eval_fraction`` of the rows (the default, as ``data.eval_fraction``);
- ``column``: rows whose ``column`` is true (a non-zero number, or ``1``/``true``/``yes``);
- ``time``: rows at or after ``at`` in ``column`` (a number, or a time in ``format``), or the
  last ``eval_fraction`` of the rows by time (ties in file order);
- ``hash``: rows whose ``key`` hashes (seeded) into the first ``eval_fraction`` of the hash
  space, so no key is on both sides (eval users are unseen);
- ``last_per_user``: each ``key``'s last row (by ``column`` when given, else in file order):
  leave-last-out.

Everything is whole-column numpy; the summary line (rows and label balance of each side) is
what the run logs at start-up.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cosparse.config import ConfigError
from cosparse.config.data import SplitConfig
from cosparse.config.labels import LabelConfig
from cosparse.data.errors import DataError
from cosparse.features import kernels as K
from cosparse.features.label_map import column_labels
from cosparse.features.sources import RawSource
from cosparse.features.transforms.time import seconds
from cosparse.features.types import FLOAT, INT, STRING_KINDS, Column

_TRUE = ["1", "true", "True", "TRUE", "yes", "y"]
_HASH_SPACE = 1 << 40


def needed_columns(s: SplitConfig) -> list[str]:
    """The columns a split reads."""
    return [c for c in (s.column, s.key) if c]


def _fraction(s: SplitConfig, default: float) -> float:
    return default if s.eval_fraction is None else s.eval_fraction


def _parsed(col: Column, s: SplitConfig) -> bool:
    """Is the time column read through ``s.format`` (else its numbers are the times)?"""
    return col.kind in STRING_KINDS or (s.format is not None
                                        and s.format not in ("unix_s", "unix_ms"))


def _times(col: Column, s: SplitConfig) -> np.ndarray:
    """The time column as numbers: its values, or unix seconds of its times in ``format``."""
    if not _parsed(col, s):
        return col.values.astype(np.float64)
    return seconds(col, s.format or "iso8601").astype(np.float64)


def _at(col: Column, s: SplitConfig) -> float:
    """``at`` on the scale of ``_times``: a number as it is; a time in ``format``, or a
    date (ISO 8601) against a unix column."""
    if isinstance(s.at, (int, float)):
        return float(s.at)
    text = Column.strings([str(s.at)])
    if _parsed(col, s):
        return float(seconds(text, s.format or "iso8601")[0])
    scale = 1000.0 if s.format == "unix_ms" else 1.0
    return float(seconds(text, "iso8601")[0]) * scale


def _truthy(col: Column) -> np.ndarray:
    present = col.present_mask()
    if col.kind in (INT, FLOAT):
        return present & (col.values != 0)
    text = pa.LargeStringArray.from_buffers(col.num_rows, pa.py_buffer(col.offsets),
                                            pa.py_buffer(col.values))
    yes = pc.is_in(text, value_set=pa.array(_TRUE, pa.large_string()))
    return present & np.asarray(yes.fill_null(False).to_numpy(zero_copy_only=False), np.bool_)


def _keys(col: Column, seed: int) -> np.ndarray:
    if col.kind in STRING_KINDS:
        return K.hash_strings(col.values, col.offsets, seed, 0)
    return K.hash_ints(col.values.astype(np.int64), seed, 0)


def eval_mask(cols: dict[str, Column], rows: int, s: SplitConfig,
              default_fraction: float) -> np.ndarray:
    """bool [rows]: the eval rows of split ``s`` (``cols``: its ``needed_columns``)."""
    f = _fraction(s, default_fraction)
    if s.by == "position":
        n_train = min(rows, max(0, int(round(rows * (1.0 - f)))))
        return np.arange(rows) >= n_train
    if s.by == "column":
        return _truthy(cols[s.column])  # type: ignore[index]
    if s.by == "time":
        col = cols[s.column]  # type: ignore[index]
        t = _times(col, s)
        if s.at is not None:
            return col.present_mask() & (t >= _at(col, s))
        order = np.lexsort((np.arange(rows), t))  # by time, ties in file order
        mask = np.zeros(rows, np.bool_)
        mask[order[min(rows, max(0, int(round(rows * (1.0 - f))))):]] = True
        return mask
    keys = _keys(cols[s.key], s.seed)  # type: ignore[index]
    if s.by == "hash":
        return (keys % _HASH_SPACE) < f * _HASH_SPACE
    # last_per_user: the last row of each key, by time then file order
    t = _times(cols[s.column], s) if s.column else np.zeros(rows)
    order = np.lexsort((np.arange(rows), t, keys))
    last = np.r_[keys[order][1:] != keys[order][:-1], True]
    mask = np.zeros(rows, np.bool_)
    mask[order[last]] = True
    return mask


def summary(labels: np.ndarray | None, mask: np.ndarray, s: SplitConfig) -> str:
    """``split by ...: train N rows (P% positive), eval M rows (Q% positive)`` (``labels``
    None: the rows only)."""
    def side(m: np.ndarray) -> str:
        n = int(m.sum())
        if labels is None:
            return f"{n:,} rows"
        pos = float(labels[m].mean()) if n else 0.0
        return f"{n:,} rows ({pos:.1%} positive)"

    return f"split by {s.by}: train {side(~mask)}, eval {side(mask)}"


def check_sides(labels: np.ndarray, mask: np.ndarray, s: SplitConfig,
                allow_one_class_eval: bool) -> None:
    """An empty train side is an error; so is an eval side of one class, unless allowed
    (then the caller warns)."""
    if not (~mask).any():
        raise ConfigError(f"data.split: by {s.by} leaves no row for training")
    ev = labels[mask]
    if len(ev) and (ev.min() == ev.max()) and not allow_one_class_eval:
        raise ConfigError(f"data.split: by {s.by}, the eval side's {len(ev):,} rows are all "
                          f"label {int(ev[0])}: AUC is undefined (data.allow_one_class_eval: "
                          "true runs anyway)")


def concat(cols: list[Column]) -> Column:
    """Scalar columns of consecutive batches as one (int, float or string)."""
    first = cols[0]
    present = (None if all(c.present is None for c in cols)
               else np.concatenate([c.present_mask() for c in cols]))
    if first.kind not in STRING_KINDS:
        return Column(first.kind, np.concatenate([c.values for c in cols]), present)
    sizes = np.cumsum([0] + [len(c.values) for c in cols[:-1]])
    offsets = np.concatenate([cols[0].offsets[:1]] + [c.offsets[1:] + base
                                                     for c, base in zip(cols, sizes, strict=True)])
    return Column(first.kind, np.concatenate([c.values for c in cols]), present, None, offsets)


def split_mask(source: RawSource, s: SplitConfig, default_fraction: float,
               tasks: dict[str, LabelConfig] | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, dict[str, np.ndarray]]:
    """(row numbers, eval mask, labels, bad records, each task's 0/1 labels) over every row of
    ``source`` that reads (one pass over the label and the columns the split needs; a bad
    record there fails the run now, or with ``on_bad_record: skip`` is on neither side).
    ``tasks``: several tasks' labels, read as 0/1 for their class checks (NaN where a value
    maps to neither: a regression's, or a bad record the reader reports)."""
    tasks = tasks or {}
    names = list(dict.fromkeys([*needed_columns(s), *(r.column for r in tasks.values())]))
    have = source.names  # type: ignore[attr-defined]
    for role in ("column", "key"):
        c = getattr(s, role)
        if c and c not in have:
            raise ConfigError(f"data.split.{role}: no column '{c}' in the data (columns: "
                              f"{', '.join(have)})")
    parts: dict[str, list[Column]] = {c: [] for c in names}
    labels, rows, bad = [], [], 0
    marks: dict[str, list[np.ndarray]] = {t: [] for t in tasks}
    for task in source.tasks():
        raw, row_of = source.build_rows(task, names)  # type: ignore[attr-defined]
        for c in names:
            parts[c].append(raw.columns[c])
        labels.append(raw.labels)
        rows.append(row_of)
        bad += raw.bad_records
        for t, rule in tasks.items():
            marks[t].append(_zero_one(raw.columns[rule.column], rule))
    y = np.concatenate(labels) if labels else np.zeros(0, np.float32)
    cols = {c: concat(p) for c, p in parts.items() if p}
    return np.concatenate(rows) if rows else np.zeros(0, np.int64), \
        eval_mask(cols, len(y), s, default_fraction), y, bad, \
        {t: np.concatenate(v) if v else np.zeros(0, np.float32) for t, v in marks.items()}


def _zero_one(col: Column, rule: LabelConfig) -> np.ndarray:
    """A task's labels as 0/1 float32, NaN where a value maps to neither."""
    try:
        y, bad = column_labels(col, rule)
    except DataError:  # (text a 0/1 label cannot read: the reader reports it)
        return np.full(col.num_rows, np.nan, np.float32)
    return np.where(bad, np.float32(np.nan), y)
