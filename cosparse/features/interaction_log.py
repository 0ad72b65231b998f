"""The loaders of ``reader: interactions``: user, item, time, label and the item's own columns
per event, sorted by (user, time, file row), read from any table the csv and parquet readers read,
or from a ``user_items`` file (one user per line: ``user item1 item2 ...`` in time order).

Every ID is a seeded 64-bit hash of its value (``data.columns.hash_seed`` and the column's role
name), strings and integers alike, as ``data.columns`` hashes; a history column shares its
target's hash (``hist_item`` is ``item``). A row missing its user, item or time is a bad record.
Without a time column the file order is the time; without a label column every event is a
positive (implicit feedback, for ``data.negatives``). ``data.columns.labels`` reads several tasks'
labels (each a column, or a column mapped to 0/1); a row whose label is missing or bad is a bad
record.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow.parquet as pq

from cosparse.config import ColumnsConfig, DataConfig
from cosparse.data.errors import DataError
from cosparse.data.interactions import InteractionLog, InteractionsReader
from cosparse.data.lines import read_blocks
from cosparse.data.split import Split
from cosparse.features import kernels as K
from cosparse.features.column_map import column_ids, column_seed
from cosparse.features.targets import Targets
from cosparse.features.transforms.time import seconds
from cosparse.features.types import FLOAT, INT, STRING, Column


def _sorted(user: np.ndarray, item: np.ndarray, time: np.ndarray, row: np.ndarray,
            label: np.ndarray | None, features: dict[str, np.ndarray], bad: int,
            tasks: dict[str, np.ndarray] | None = None) -> InteractionLog:
    order = np.lexsort((row, time, user))
    return InteractionLog(user[order], item[order], time[order], row[order],
                          None if label is None else label[order],
                          {f: v[order] for f, v in features.items()}, {}, bad,
                          tasks={t: v[order] for t, v in (tasks or {}).items()})


_LOGS: dict[str, InteractionLog] = {}


def interactions_reader(data: DataConfig, split: Split,
                        regression: frozenset[str] = frozenset()) -> InteractionsReader:
    """The reader of one split of ``data``'s log (with ``data.eval_path``: of both files' log,
    whose eval targets are the eval file's events); ``regression``: the tasks of
    ``data.columns.labels`` that are regressions (their labels any finite number)."""
    log = load_interactions(data, regression)
    if data.eval_path is not None:
        log = with_eval_file(log, load_interactions(dataclasses.replace(data,
                                                                        path=data.eval_path),
                                                    regression),
                             data.eval_path)
    return InteractionsReader(log, data, split)


def with_eval_file(train: InteractionLog, eval_: InteractionLog, eval_path: str
                   ) -> InteractionLog:
    """One log of the training file's events and the eval file's, these marked as the eval
    targets (their histories hold both files' earlier events; file order: train, then eval)."""
    if (train.label is None) != (eval_.label is None) or \
            set(train.features) != set(eval_.features) or set(train.tasks) != set(eval_.tasks):
        raise DataError(f"{eval_path}: the eval file must have the training file's label and "
                        f"item columns (data.eval_path)")
    shift = int(train.row.max()) + 1 if train.num_events else 0

    def both(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.concatenate([a, b])
    merged = _sorted(both(train.user, eval_.user), both(train.item, eval_.item),
                     both(train.time, eval_.time), both(train.row, eval_.row + shift),
                     None if train.label is None else both(train.label, eval_.label),
                     {f: both(train.features[f], eval_.features[f]) for f in train.features},
                     train.bad_records + eval_.bad_records,
                     {t: both(train.tasks[t], eval_.tasks[t]) for t in train.tasks})
    return dataclasses.replace(merged, eval_mask=merged.row >= shift)


def load_interactions(data: DataConfig, regression: frozenset[str] = frozenset()
                      ) -> InteractionLog:
    """The log of ``data`` (read once per process)."""
    key = repr((data.path, data.csv, data.schema, data.columns, data.events.layout,
                data.on_bad_record, sorted(regression)))
    if key not in _LOGS:
        cols = data.columns or ColumnsConfig()
        _LOGS[key] = (read_user_items(data, cols) if data.events.layout == "user_items"
                      else read_table(data, cols, regression))
    return _LOGS[key]


def read_user_items(data: DataConfig, cols: ColumnsConfig) -> InteractionLog:
    """A file of ``user item1 item2 ...`` lines (space or tab separated, plain or gzip)."""
    path = str(data.path)
    raw = b"".join(read_blocks(path))
    buf = np.frombuffer(raw, np.uint8)
    space = (buf == 32) | (buf == 9) | (buf == 10) | (buf == 13)
    prev_space = np.concatenate([[True], space[:-1]])
    next_space = np.concatenate([space[1:], [True]])
    starts = np.flatnonzero(~space & prev_space)
    ends = np.flatnonzero(~space & next_space) + 1
    line = np.searchsorted(np.flatnonzero(buf == 10), starts)  # 0-based line of each token
    first = np.ones(len(starts), np.bool_)
    first[1:] = line[1:] != line[:-1]
    lengths = ends - starts
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    text = buf[~space]  # the tokens back to back
    user_ids = K.hash_strings(text, offsets, column_seed(cols.hash_seed, "user"), 0)
    item_ids = K.hash_strings(text, offsets, column_seed(cols.hash_seed, "item"), 0)
    owner = np.maximum.accumulate(np.where(first, np.arange(len(starts)), 0))
    events = np.flatnonzero(~first)  # every token after a line's first
    if len(events) == 0:
        raise DataError(f"{path}: no interactions (expected lines 'user item1 item2 ...')")
    time = events - owner[events]  # the position in the user's line
    return _sorted(user_ids[owner[events]], item_ids[events], time.astype(np.int64),
                   line[events].astype(np.int64), None, {}, 0)


def read_table(data: DataConfig, cols: ColumnsConfig,
               regression: frozenset[str] = frozenset()) -> InteractionLog:
    """One event per row of a csv, tsv or parquet table (``regression``: the tasks of
    ``data.columns.labels`` whose labels are numbers, not mapped to 0/1)."""
    from cosparse.features.csv_source import CsvRawSource
    from cosparse.features.sources import ParquetRawSource

    path = str(data.path)
    roles = {"user": cols.user, "item": cols.item, "time": cols.time}
    targets = (Targets(cols.labels, set(regression), None, data.on_bad_record) if cols.labels
               else None)
    wanted = list(dict.fromkeys(c for c in (cols.user, cols.item, cols.time,
                                            *cols.item_features,
                                            *(targets.columns if targets else ())) if c))
    parquet = path.endswith((".parquet", ".pq"))
    names = (pq.ParquetFile(path).schema_arrow.names if parquet
             else CsvRawSource(path, 1 << 16, "train", 0.0, data.on_bad_record, data.csv,
                               dict(data.schema), None).names)
    missing = [c for c in wanted if c not in names]
    if missing:
        raise DataError(f"{path}: data.columns names columns the file lacks: "
                        f"{', '.join(missing)} (columns: {', '.join(names)})")
    label = cols.label if cols.label.column in names and targets is None else None
    if label is None and cols.label.mapped:
        raise DataError(f"{path}: no label column '{cols.label.column}' (data.columns.label; "
                        f"columns: {', '.join(names)})")
    source = (ParquetRawSource(path, 1 << 16, "train", 0.0, data.on_bad_record, label,
                               columns=wanted) if parquet
              else CsvRawSource(path, 1 << 16, "train", 0.0, data.on_bad_record, data.csv,
                                dict(data.schema), label))
    parts: dict[str, list[np.ndarray]] = {c: [] for c in ("user", "item", "time", "row",
                                                           "label", *cols.item_features)}
    task_parts: dict[str, list[np.ndarray]] = {t: [] for t in cols.labels}
    bad = 0
    for task in source.tasks():
        batch, rows = source.build_rows(task, wanted)  # type: ignore[attr-defined]
        bad += batch.bad_records
        c = batch.columns
        ok = np.ones(batch.num_rows, np.bool_)
        for role, name in roles.items():
            if not name:
                continue
            present = c[name].present_mask()
            if data.on_bad_record == "fail" and not present.all():
                r = int(rows[np.flatnonzero(~present)[0]])
                raise DataError(f"{path}: row {r} (0-based): no {role} (column {name})")
            ok &= present
        if targets is not None:
            marks, _, bad_targets = targets.values(batch)
            ok &= ~bad_targets
            for t, v in marks.items():
                task_parts[t].append(v[ok])
        bad += int((~ok).sum())
        for role in ("user", "item"):
            parts[role].append(_ids(c[roles[role]], cols, role)[ok])  # type: ignore[index]
        parts["time"].append(_time(c[cols.time], cols.time_format, path)[ok] if cols.time
                             else rows[ok])
        parts["row"].append(rows[ok])
        parts["label"].append(batch.labels[ok])
        for f in cols.item_features:
            parts[f].append(_ids(c[f], cols, f)[ok])
    if not parts["row"] or sum(len(r) for r in parts["row"]) == 0:
        raise DataError(f"{path}: no interactions")
    cat = {k: np.concatenate(v) for k, v in parts.items()}
    return _sorted(cat["user"], cat["item"], cat["time"], cat["row"],
                   cat["label"] if label else None,
                   {f: cat[f] for f in cols.item_features}, bad,
                   {t: np.concatenate(v) for t, v in task_parts.items()})


def _ids(col: Column, cols: ColumnsConfig, role: str) -> np.ndarray:
    """One ID per row (0 where missing) of a user, item or item-feature column."""
    ids, lengths = column_ids(col, column_seed(cols.hash_seed, role))
    out = np.zeros(len(lengths), np.int64)
    out[lengths > 0] = ids
    return out


def _time(col: Column, fmt: str | None, path: str) -> np.ndarray:
    """The time column as integers: numbers as they are, text (or ``fmt``) as unix seconds."""
    if fmt is None and col.kind == INT:
        return col.values.astype(np.int64)
    if fmt is None and col.kind == FLOAT:
        return np.nan_to_num(col.values).astype(np.int64)
    if fmt is None and col.kind != STRING:
        raise DataError(f"{path}: data.columns.time: the time column holds {col.kind} values, "
                        "not times")
    try:
        return seconds(col, fmt or "iso8601")
    except DataError as e:
        raise DataError(f"{path}: data.columns.time: {e} (set data.columns.time_format)") from None
