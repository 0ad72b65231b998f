"""Event-log reader (Taobao UserBehavior CSV): one sample per target event, with the user's
behaviour sequence before it.

Input lines are ``user_id,item_id,category_id,behavior_type,unix_timestamp`` (behaviour one of
pv, cart, fav, buy), grouped by user but not time-sorted within a user. The whole log is parsed
once per process by a numba kernel and sorted by (user, timestamp, file line): ties in time keep
file order, so everything below is deterministic.

Sample of target event ``e``: features ``user``, ``target_item``, ``target_cate`` (bags of one)
and ``hist_item``, ``hist_cate``, ``hist_btag`` (jagged, the same length): the user's events with
a timestamp strictly before ``e``'s, most recent first, at most ``max_len`` of them (the most
recent are kept). ``hist_btag`` is the behaviour code (pv 0, cart 1, fav 2, buy 3). The label is
1 when ``e``'s behaviour is in ``positive``. There are no dense features (dense is [B, 0]).
Targets need ``min_history`` preceding events.

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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from cosparse.batch import SparseBatch
from cosparse.config import EventsConfig, ShuffleConfig
from cosparse.data import event_kernels as K
from cosparse.data.errors import DataError, empty_split_message
from cosparse.data.shuffle import shuffled, window_batches
from cosparse.data.split import Split, num_batches, split_range

OnBadRecord = Literal["fail", "skip"]
SEQUENCE_KEYS = ["user", "target_item", "target_cate", "hist_item", "hist_cate", "hist_btag"]


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


@dataclass(frozen=True)
class SequenceIndex:
    """Per sorted event: where its history starts and ends (``[lo, hi)``, before truncation)."""

    user_start: np.ndarray  # first event of the user
    run_start: np.ndarray  # first event of the user with this timestamp (history ends here)
    time_rank: np.ndarray  # rank in global (timestamp, line) order


def sequence_index(log: EventLog) -> SequenceIndex:
    return index_events(log.user, log.ts, log.line)


def index_events(user: np.ndarray, ts: np.ndarray, line: np.ndarray) -> SequenceIndex:
    """The index of events sorted by (user, timestamp, line)."""
    n = user.shape[0]
    idx = np.arange(n, dtype=np.int64)
    new_user = np.ones(n, dtype=bool)
    new_user[1:] = user[1:] != user[:-1]
    new_run = new_user.copy()
    new_run[1:] |= ts[1:] != ts[:-1]
    user_start = np.maximum.accumulate(np.where(new_user, idx, 0))
    run_start = np.maximum.accumulate(np.where(new_run, idx, 0))
    time_rank = np.empty(n, dtype=np.int64)
    time_rank[np.lexsort((line, ts))] = idx
    return SequenceIndex(user_start, run_start, time_rank)


@dataclass(frozen=True)
class EventsTask:
    """The sorted-event positions of one batch's target events."""

    index: int
    positions: np.ndarray


class TaobaoEventsReader:
    """Behaviour-sequence samples of one split of a Taobao-style event log."""

    def __init__(
        self,
        path: str | Path,
        batch_size: int,
        split: Split = "train",
        eval_fraction: float = 0.2,
        on_bad_record: OnBadRecord = "fail",
        events: EventsConfig | None = None,
        shuffle: ShuffleConfig | None = None,
    ) -> None:
        if batch_size <= 0:
            raise ValueError("batch_size must be positive")
        if on_bad_record not in ("fail", "skip"):
            raise ValueError(f"on_bad_record must be 'fail' or 'skip', got {on_bad_record!r}")
        ev = events or EventsConfig()
        if not 1 <= ev.max_len <= 10_000:
            raise ValueError("events.max_len must be in [1, 10000]")
        unknown = [b for b in ev.positive if b not in K.BEHAVIOURS]
        if unknown:
            raise ValueError(f"events.positive: unknown behaviours {unknown}")
        self.path = str(path)
        self.batch_size = batch_size
        self.split: Split = split
        self.events = ev
        self.keys: list[str] = list(SEQUENCE_KEYS)
        self.num_dense: int = 0
        log = load_event_log(self.path)
        if log.first_error is not None and on_bad_record == "fail":
            raise DataError(log.first_error)
        self.bad_records = int(log.bad_lines.shape[0]) if split == "train" else 0
        ix = sequence_index(log)
        self._item, self._cate, self._btag = log.item, log.cate, log.btag
        self._user, self._ts = log.user, log.ts
        self._label = np.isin(log.btag, [K.BEHAVIOURS.index(b) for b in ev.positive])
        self._lo = np.maximum(ix.user_start, ix.run_start - ev.max_len)
        self._hi = ix.run_start
        first, count = split_range(log.num_events, eval_fraction, split)
        in_split = (ix.time_rank >= first) & (ix.time_rank < first + count)
        eligible = in_split & (ix.run_start - ix.user_start >= ev.min_history)
        pos = np.flatnonzero(eligible).astype(np.int64)
        pos = pos[np.argsort(ix.time_rank[pos], kind="stable")]  # time order
        if split == "train" and pos.shape[0] == 0:
            if not in_split.any():
                raise DataError(empty_split_message(self.path, log.num_events, "events",
                                                    eval_fraction))
            raise DataError(f"{self.path}: no training samples: none of the {count} events of "
                            f"the training split has data.events.min_history "
                            f"({ev.min_history}) earlier events of its user")
        if split == "train" and ev.shuffle:
            pos = pos[np.random.default_rng(ev.seed).permutation(pos.shape[0])]
        elif split == "train" and shuffle is not None:
            pos = shuffled(pos, window_batches(shuffle.buffer, batch_size) * batch_size,
                           shuffle.seed)
        self.positions = pos

    @property
    def num_samples(self) -> int:
        return int(self.positions.shape[0])

    @property
    def num_batches(self) -> int:
        return num_batches(self.num_samples, self.batch_size)

    def tasks(self, start_batch: int = 0) -> Iterator[EventsTask]:
        if start_batch < 0:
            raise ValueError("start_batch must be >= 0")
        bs = self.batch_size
        for i in range(start_batch, self.num_batches):
            yield EventsTask(i, self.positions[i * bs : (i + 1) * bs])

    def build(self, task: EventsTask) -> SparseBatch:
        """The SparseBatch of one task (pure; safe in a worker process)."""
        pos = task.positions
        lo, hi = self._lo[pos], self._hi[pos]
        hist = sequences_from_ranges(self._item, self._cate, self._btag, lo, hi)
        bad = self.bad_records if task.index == 0 else 0
        return sequence_batch(self._user[pos], self._item[pos], self._cate[pos], *hist,
                              self._label[pos].astype(np.float32), task.index, bad)


def sequences_from_ranges(
    item: np.ndarray, cate: np.ndarray, btag: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(lengths, items, cates, btags) of the events ``[lo, hi)`` per sample, most recent first."""
    lengths = (hi - lo).astype(np.int64)
    offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    n = int(offsets[-1])
    out_i, out_c, out_b = (np.empty(n, np.int64) for _ in range(3))
    K.gather_history(item, cate, btag, lo, hi, offsets, out_i, out_c, out_b)
    return lengths, out_i, out_c, out_b


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
