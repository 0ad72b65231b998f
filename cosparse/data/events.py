"""Event-log reader (Taobao UserBehavior CSV): one sample per target event, with the user's
behaviour sequence before it. It is the preset of ``cosparse.data.interactions`` for this file:
this module parses the log, the interactions reader makes the samples.

Input lines are ``user_id,item_id,category_id,behavior_type,unix_timestamp`` (behaviour one of
pv, cart, fav, buy), grouped by user but not time-sorted within a user. The whole log is parsed
once per process by a numba kernel and sorted by (user, timestamp, file line): ties in time keep
file order, so everything below is deterministic.

Sample of target event ``e``: features ``user``, ``target_item``, ``target_cate`` (bags of one)
and ``hist_item``, ``hist_cate``, ``hist_btag`` (jagged, the same length): the user's events with
a timestamp strictly before ``e``'s, most recent first, at most ``max_len`` of them (the most
recent are kept). ``hist_btag`` is the behaviour code (pv 0, cart 1, fav 2, buy 3). The label is
1 when ``e``'s behaviour is in ``positive``; with several tasks (``data.columns.labels``), each
task's label is 1 when it is in that task's ``positive`` list. There are no dense features
(dense is [B, 0]). Targets need ``min_history`` preceding events.

Split by time: events ranked by (timestamp, file line); the last ``eval_fraction`` of them are the
eval targets, so every eval target comes after every train target (histories may reach back into
the train period: that is the user's past, not a label). Train samples are shuffled with ``seed``
(``events.shuffle``: the whole split), or within windows (``data.shuffle``), or kept in time
order; eval samples are in time order.

Bad lines raise DataError ``file:line: ...`` naming the column, or with ``on_bad_record: skip``
are dropped and counted (in ``bad_records`` of the train split's first batch).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from cosparse.batch import SparseBatch
from cosparse.config import DataConfig, EventsConfig, LabelConfig, ShuffleConfig
from cosparse.data import event_kernels as K
from cosparse.data.errors import DataError
from cosparse.data.interactions import InteractionLog, InteractionsReader
from cosparse.data.split import Split

OnBadRecord = Literal["fail", "skip"]
SEQUENCE_KEYS = ["user", "target_item", "target_cate", "hist_item", "hist_cate", "hist_btag"]
TARGET_NAMES = {"item": "target_item", "cate": "target_cate"}


@dataclass(frozen=True)
class EventLog:
    """The parsed log sorted by (user, timestamp, line); ``line`` is the 1-based file line."""

    user: np.ndarray
    item: np.ndarray
    cate: np.ndarray
    btag: np.ndarray  # int64 behaviour code
    ts: np.ndarray
    line: np.ndarray
    bad_lines: np.ndarray  # 1-based lines that failed to parse
    first_error: str | None  # the message of the first bad line

    @property
    def num_events(self) -> int:
        return int(self.user.shape[0])


def describe_bad_line(path: str, line_no: int, text: str, code: int, col: int, ncols: int) -> str:
    """The DataError message of a bad line: ``path:line: what was wrong``."""
    where = f"{path}:{line_no}"
    if code == K.ERR_COLUMNS:
        return f"{where}: wrong column count: expected {K.NUM_COLS} got {ncols}"
    fields = text.split(",")
    field = fields[col] if 0 <= col < len(fields) else ""
    field = field if len(field) <= 40 else field[:37] + "..."
    name = K.COLUMNS[col] if 0 <= col < len(K.COLUMNS) else f"column {col}"
    if code == K.ERR_BEHAVIOUR:
        return f"{where}: bad {name} {field!r} (expected one of {', '.join(K.BEHAVIOURS)})"
    if code == K.ERR_RANGE:
        return f"{where}: integer field {name} {field!r} is out of range (over 18 digits)"
    return f"{where}: non-numeric integer field {name} {field!r}"


@functools.lru_cache(maxsize=4)
def _load(path: str, mtime_ns: int, size: int) -> EventLog:
    buf = np.fromfile(path, dtype=np.uint8)
    n = K.count_lines(buf)
    cols, btag, err, err_col, ncols = K.empty_outputs(n)
    K.parse_events(buf, n, cols, btag, err, err_col, ncols)
    bad = np.flatnonzero(err != K.ERR_OK)
    first_error = None
    if bad.shape[0]:
        i = int(bad[0])
        with open(path, "rb") as f:  # error path only: find the text of that line
            for j, raw in enumerate(f):
                if j == i:
                    text = raw.decode("utf-8", "replace").rstrip("\r\n")
                    break
            else:  # pragma: no cover - the kernel counted the line
                text = ""
        first_error = describe_bad_line(path, i + 1, text, int(err[i]), int(err_col[i]),
                                        int(ncols[i]))
    keep = np.flatnonzero(err == K.ERR_OK)
    cols = cols[keep]
    line = keep.astype(np.int64) + 1
    order = np.lexsort((line, cols[:, 3], cols[:, 0]))
    c = cols[order]
    return EventLog(
        user=np.ascontiguousarray(c[:, 0]), item=np.ascontiguousarray(c[:, 1]),
        cate=np.ascontiguousarray(c[:, 2]), btag=btag[keep][order].astype(np.int64),
        ts=np.ascontiguousarray(c[:, 3]), line=line[order], bad_lines=bad.astype(np.int64) + 1,
        first_error=first_error,
    )


def load_event_log(path: str | Path) -> EventLog:
    """The parsed, sorted log of ``path`` (cached per process while the file is unchanged)."""
    p = str(path)
    if not os.path.isfile(p):
        raise DataError(f"{p}: data file not found")
    st = os.stat(p)
    return _load(p, st.st_mtime_ns, st.st_size)


class TaobaoEventsReader(InteractionsReader):
    """Behaviour-sequence samples of one split of a Taobao-style event log: the preset of
    ``InteractionsReader`` whose log this module parses (raw IDs, labels by behaviour, the
    category as the item's column, the behaviour in histories)."""

    def __init__(
        self,
        path: str | Path,
        batch_size: int,
        split: Split = "train",
        eval_fraction: float = 0.2,
        on_bad_record: OnBadRecord = "fail",
        events: EventsConfig | None = None,
        shuffle: ShuffleConfig | None = None,
        labels: dict[str, LabelConfig] | None = None,
    ) -> None:
        """``labels``: several tasks' labels (``data.columns.labels``), each positive when
        the event's behaviour is in its ``positive`` list (None: one label,
        ``events.positive``)."""
        if batch_size <= 0:
            raise ValueError("batch_size must be positive")
        if on_bad_record not in ("fail", "skip"):
            raise ValueError(f"on_bad_record must be 'fail' or 'skip', got {on_bad_record!r}")
        ev = events or EventsConfig()
        if not 1 <= ev.max_len <= 10_000:
            raise ValueError("events.max_len must be in [1, 10000]")
        positive = {t: [str(b) for b in r.positive or ()] for t, r in (labels or {}).items()}
        one = {"label": ev.positive or ["buy"]} if not positive else positive
        unknown = [b for bs in one.values() for b in bs if b not in K.BEHAVIOURS]
        if unknown:
            raise ValueError(f"events.positive: unknown behaviours {unknown}")
        log = load_event_log(path)
        if log.first_error is not None and on_bad_record == "fail":
            raise DataError(log.first_error)
        marks = {t: np.isin(log.btag, [K.BEHAVIOURS.index(b) for b in bs]).astype(np.float32)
                 for t, bs in one.items()}
        interactions = InteractionLog(
            log.user, log.item, log.ts, log.line, None if positive else marks["label"],
            {"cate": log.cate}, {"btag": log.btag}, int(log.bad_lines.shape[0]),
            tasks=marks if positive else {})
        data = DataConfig(reader="taobao_events", path=str(path), batch_size=batch_size,
                          on_bad_record=on_bad_record, eval_fraction=eval_fraction, events=ev,
                          shuffle=shuffle)
        super().__init__(interactions, data, split, TARGET_NAMES)


def sequence_batch(
    user: np.ndarray, target_item: np.ndarray, target_cate: np.ndarray, lengths: np.ndarray,
    hist_item: np.ndarray, hist_cate: np.ndarray, hist_btag: np.ndarray, labels: np.ndarray,
    index: int = 0, bad_records: int = 0,
) -> SparseBatch:
    """A SparseBatch with the keys of ``SEQUENCE_KEYS`` (no dense features)."""
    b = user.shape[0]
    ones = np.ones(b, dtype=np.int64)
    values = np.concatenate([user, target_item, target_cate, hist_item, hist_cate, hist_btag])
    lens = np.concatenate([ones, ones, ones, lengths, lengths, lengths])
    return SparseBatch(
        list(SEQUENCE_KEYS),
        torch.from_numpy(values.astype(np.int64, copy=False)),
        torch.from_numpy(lens),
        torch.zeros((b, 0), dtype=torch.float32),
        torch.from_numpy(np.ascontiguousarray(labels, dtype=np.float32)),
        bad_records=bad_records,
        index=index,
    )
