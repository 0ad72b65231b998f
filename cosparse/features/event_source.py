"""EventLogRawSource: the raw columns of a Taobao-style event log (one row per target event, with
the user's preceding events as jagged columns), for the feature platform.

The targets, their order, the split, the shuffle and the labels are exactly those of
``cosparse.data.events.TaobaoEventsReader``, which this source wraps (the log is parsed, sorted and
indexed once per process there). Columns per target event:

- scalars (int): ``user_id``, ``item_id``, ``category_id``, ``behavior_type`` (the behaviour code:
  pv 0, cart 1, fav 2, buy 3) and ``timestamp``;
- jagged (list_int) over the preceding events, most recent first, at most ``events.max_len``:
  ``hist_item_id``, ``hist_category_id``, ``hist_behavior_type`` and ``hist_timestamp`` (the same
  elements, in the same order, as the reader's ``hist_item`` / ``hist_cate`` / ``hist_btag``).

The raw columns are named after the log's fields, so that a spec can name its features like the
reader's (``user``, ``hist_item``, ...): a feature may not share a raw column's name.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from cosparse.config import EventsConfig, ShuffleConfig
from cosparse.data.events import OnBadRecord, TaobaoEventsReader
from cosparse.data.interactions import EventsTask
from cosparse.data.split import Split
from cosparse.features.types import INT, LIST_INT, Column, ColumnKind, RawBatch

SCALAR_COLUMNS = ("user_id", "item_id", "category_id", "behavior_type", "timestamp")
HISTORY_COLUMNS = ("hist_item_id", "hist_category_id", "hist_behavior_type", "hist_timestamp")


class EventLogRawSource:
    """One split of an event log as raw columns (see the module docstring); picklable, and
    ``build_raw`` is pure, so it runs in the data-worker processes."""

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
        self._events = TaobaoEventsReader(path, batch_size, split, eval_fraction, on_bad_record,
                                          events, shuffle)
        self.path = self._events.path
        self.batch_size = batch_size
        self.split: Split = split
        self.eval_fraction = eval_fraction
        self.on_bad_record: OnBadRecord = on_bad_record
        self.events = self._events.events
        self.columns: dict[str, ColumnKind] = {c: INT for c in SCALAR_COLUMNS}
        self.columns.update({c: LIST_INT for c in HISTORY_COLUMNS})

    @property
    def num_samples(self) -> int:
        return self._events.num_samples

    @property
    def num_batches(self) -> int:
        return self._events.num_batches

    def tasks(self, start_batch: int = 0) -> Iterator[EventsTask]:
        return self._events.tasks(start_batch)

    def build_raw(self, task: EventsTask) -> RawBatch:
        r = self._events
        log = r.log
        e, item, label, feats = r.targets(task.positions)
        hist, lengths = r.history(e)
        scalars = (log.user[e], item, feats["cate"], log.history["btag"][e], log.time[e])
        cols = {name: Column(INT, np.ascontiguousarray(v, np.int64))
                for name, v in zip(SCALAR_COLUMNS, scalars, strict=True)}
        flat = (log.item[hist], log.features["cate"][hist], log.history["btag"][hist],
                log.time[hist])
        for name, v in zip(HISTORY_COLUMNS, flat, strict=True):
            cols[name] = Column(LIST_INT, np.ascontiguousarray(v, np.int64), None, lengths)
        bad = r.bad_records if task.index == 0 else 0
        return RawBatch(cols, label.astype(np.float32), task.index, bad, f"{self.path}: ")
