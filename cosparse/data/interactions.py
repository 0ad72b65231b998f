"""Behaviour-sequence samples of an interaction log: the reader behind ``reader: interactions``
and its preset ``reader: taobao_events``.

An ``InteractionLog`` holds the events sorted by (user, time, file row), whoever loaded them: the
Taobao parser (``cosparse.data.events``), or the table and user_items loaders of the feature
platform (``cosparse.features.interaction_log``). ``InteractionsReader`` makes one sample per
target event: its user, its item and the item's own columns, with the user's most recent
``data.events.max_len`` events strictly before it as histories (``hist_item``, ``hist_<column>``
for the item's and the event's own columns, most recent first). Targets need
``data.events.min_history`` earlier events. The split is by time (the last ``eval_fraction`` of
events) or ``data.split: {by: last_per_user}`` (leave-last-out). Labels come from the log, or
every event is a positive and ``data.negatives`` adds sampled negatives (the same user, time and
history, another item); negatives are never events, so never in a history. Several tasks' labels
(``data.columns.labels``) come from the log too: every event is then an interaction (negatives
are drawn for each), and a sampled negative's label is 0 for every task. Train samples are
shuffled by ``data.events.shuffle`` (whole split) or ``data.shuffle`` (windows); eval samples keep
time order, each positive followed by its negatives. A retrieval model's mixed negatives
(``data.events.uniform_negatives``: k uniformly drawn items per sample, ``neg{j}_item`` and
``neg{j}_<column>``) come last (``cosparse.data.uniform_negatives``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from cosparse.batch import SparseBatch
from cosparse.config import DataConfig
from cosparse.data.dropped_targets import dropped_targets
from cosparse.data.errors import DataError, empty_split_message
from cosparse.data.negatives import sample_negatives
from cosparse.data.shuffle import shuffled, window_batches
from cosparse.data.split import Split, num_batches, split_range
from cosparse.data.uniform_negatives import UniformNegatives, negative_keys


@dataclass(frozen=True)
class InteractionLog:
    """Events sorted by (user, time, row); ``row``: the file row or line (ties in time keep
    it); ``label`` None: every event is a positive; ``features``: the item's own columns (of
    targets and histories); ``history``: the event's own columns (histories only)."""

    user: np.ndarray
    item: np.ndarray
    time: np.ndarray
    row: np.ndarray
    label: np.ndarray | None
    features: dict[str, np.ndarray] = field(default_factory=dict)
    history: dict[str, np.ndarray] = field(default_factory=dict)
    bad_records: int = 0
    eval_mask: np.ndarray | None = None  # the events of data.eval_path (None: a split)
    # several tasks' labels per event (data.columns.labels; then label is None: every event is
    # an interaction, and a sampled negative is 0 for every task)
    tasks: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def num_events(self) -> int:
        return int(self.user.shape[0])


@dataclass(frozen=True)
class SequenceIndex:
    """Per sorted event: where its history starts and ends (``[lo, hi)``, before truncation)."""

    user_start: np.ndarray  # first event of the user
    run_start: np.ndarray  # first event of the user with this timestamp (history ends here)
    time_rank: np.ndarray  # rank in global (timestamp, row) order


def index_events(user: np.ndarray, ts: np.ndarray, row: np.ndarray,
                 keep_file_order: bool = False) -> SequenceIndex:
    """The index of events sorted by (user, timestamp, row); ``keep_file_order``: events of one
    user at one time are each other's history in file order (``data.events.ties``)."""
    n = user.shape[0]
    idx = np.arange(n, dtype=np.int64)
    new_user = np.ones(n, dtype=bool)
    new_user[1:] = user[1:] != user[:-1]
    new_run = new_user.copy()
    new_run[1:] |= ts[1:] != ts[:-1]
    if keep_file_order:
        new_run[:] = True
    user_start = np.maximum.accumulate(np.where(new_user, idx, 0))
    run_start = np.maximum.accumulate(np.where(new_run, idx, 0))
    time_rank = np.empty(n, dtype=np.int64)
    time_rank[np.lexsort((row, ts))] = idx
    return SequenceIndex(user_start, run_start, time_rank)


def reversed_range_index(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Flat positions ``hi[s]-1`` down to ``lo[s]`` per row s (a history, most recent first)."""
    lengths = (hi - lo).astype(np.int64)
    starts = np.zeros(lengths.shape[0], np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    return np.repeat(hi - 1 + starts, lengths) - np.arange(int(lengths.sum()), dtype=np.int64)


@dataclass(frozen=True)
class EventsTask:
    """The sample positions of one batch."""

    index: int
    positions: np.ndarray


def eval_events(log: InteractionLog, data: DataConfig, time_rank: np.ndarray) -> np.ndarray:
    """Which events are eval targets."""
    if log.eval_mask is not None:
        return log.eval_mask
    s = data.split
    if s is not None and s.by == "last_per_user":
        last = np.ones(log.num_events, np.bool_)
        last[:-1] = log.user[1:] != log.user[:-1]
        return last
    frac = s.eval_fraction if s is not None and s.eval_fraction is not None \
        else data.eval_fraction
    first, count = split_range(log.num_events, frac, "eval")
    return (time_rank >= first) & (time_rank < first + count)


class InteractionsReader:
    """One split of an interaction log as SparseBatches (see the module docstring). ``names``
    renames the target keys (Taobao's ``target_item``, ``target_cate``)."""

    def __init__(self, log: InteractionLog, data: DataConfig, split: Split = "train",
                 names: dict[str, str] | None = None) -> None:
        self.path = str(data.path)
        self.batch_size = data.batch_size
        self.split: Split = split
        self.log = log
        self.events = ev = data.events
        ix = index_events(log.user, log.time, log.row, ev.ties == "keep_file_order")
        self._lo = np.maximum(ix.user_start, ix.run_start - ev.max_len)
        self._hi = ix.run_start
        self._first = ix.user_start
        is_eval = eval_events(log, data, ix.time_rank)
        self.in_train = ~is_eval  # (per event: the training split's)
        in_split = is_eval if split == "eval" else ~is_eval
        enough = ix.run_start - ix.user_start >= ev.min_history
        self.dropped = dropped_targets(log.user, ix.user_start, in_split, enough,
                                       ev.min_history)
        pos = np.flatnonzero(in_split & enough)
        pos = pos[np.argsort(ix.time_rank[pos], kind="stable")]  # time order
        if split == "train" and pos.shape[0] == 0:
            if not in_split.any():
                raise DataError(empty_split_message(self.path, log.num_events, "events",
                                                    data.eval_fraction))
            raise DataError(f"{self.path}: no training samples: none of the "
                            f"{int(in_split.sum())} events of the training split has "
                            f"data.events.min_history ({ev.min_history}) earlier events of its "
                            "user")
        label = np.ones(len(pos), np.float32) if log.label is None else log.label[pos]
        tasks = {t: v[pos] for t, v in log.tasks.items()}
        event, item, neg = pos, log.item[pos], np.zeros(len(pos), np.int64)
        self.undrawn = 0
        if data.negatives is not None:
            per = data.negatives.eval_per_positive if split == "eval" else None
            negatives = data.negatives if per is None else \
                dataclasses.replace(data.negatives, per_positive=per)
            n = sample_negatives(log.user, log.item, log.time, pos[label > 0.5],
                                 np.flatnonzero(~is_eval), negatives,
                                 salt=0 if split == "train" else 1)
            self.undrawn = n.undrawn
            neg = np.concatenate([neg, np.ones(len(n.event), np.int64)])
            event = np.concatenate([pos, n.event])
            item = np.concatenate([item, n.item])
            label = np.concatenate([label, np.zeros(len(n.event), np.float32)])
            tasks = {t: np.concatenate([v, np.zeros(len(n.event), v.dtype)])
                     for t, v in tasks.items()}
            order = np.lexsort((neg, ix.time_rank[event]))  # each positive, then its negatives
            event, item, label, neg = event[order], item[order], label[order], neg[order]
            tasks = {t: v[order] for t, v in tasks.items()}
        feature_of_item = item_features(log)
        feats = {f: np.where(neg == 1, feature_of_item(f, item), log.features[f][event])
                 for f in log.features}
        order = np.arange(len(event))
        if split == "train" and ev.shuffle:
            order = np.random.default_rng(ev.seed).permutation(len(event))
        elif split == "train" and data.shuffle is not None:
            order = shuffled(order, window_batches(data.shuffle.buffer, self.batch_size)
                             * self.batch_size, data.shuffle.seed)
        self._event, self._item, self._label = event[order], item[order], label[order]
        self._feats = {f: v[order] for f, v in feats.items()}
        self._tasks = {t: np.ascontiguousarray(v[order], np.float32) for t, v in tasks.items()}
        self.features = list(log.features)
        named = names or {}
        self.target_keys = [named.get(k, k) for k in ("user", "item", *self.features)]
        self.keys: list[str] = (self.target_keys + ["hist_item"]
                                + [f"hist_{f}" for f in (*self.features, *log.history)])
        self._negatives = UniformNegatives(log.item[self.in_train], ev.uniform_negatives, ev.seed,
                                           0 if split == "train" else 1, feature_of_item,
                                           self.features)
        self.keys += negative_keys(self.target_keys[1:], ev.uniform_negatives)
        self.num_dense: int = 0
        self.bad_records = log.bad_records if split == "train" else 0

    @property
    def num_samples(self) -> int:
        return int(self._event.shape[0])

    @property
    def num_batches(self) -> int:
        return num_batches(self.num_samples, self.batch_size)

    def tasks(self, start_batch: int = 0) -> Iterator[EventsTask]:
        if start_batch < 0:
            raise ValueError("start_batch must be >= 0")
        bs = self.batch_size
        for i in range(start_batch, self.num_batches):
            yield EventsTask(i, np.arange(i * bs, min((i + 1) * bs, self.num_samples)))

    def targets(self, s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                              dict[str, np.ndarray]]:
        """(target events, their items, labels, item columns) of the samples ``s``."""
        return self._event[s], self._item[s], self._label[s], {f: v[s] for f, v in
                                                               self._feats.items()}

    def target_events(self) -> np.ndarray:
        """Every sample's target event, in sample order."""
        return self._event

    def earlier_events(self, events: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(flat event positions, count per target) of all the targets' users' earlier events
        (untruncated histories)."""
        lo, hi = self._first[events], self._hi[events]
        return reversed_range_index(lo, hi), (hi - lo).astype(np.int64)

    def history(self, events: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(flat event positions, length per target) of the targets' histories."""
        lo, hi = self._lo[events], self._hi[events]
        return reversed_range_index(lo, hi), (hi - lo).astype(np.int64)

    def samples(self) -> dict[str, np.ndarray]:
        """Every sample's target columns by key, and ``label`` (for baselines)."""
        e, item, label, feats = self.targets(np.arange(self.num_samples))
        cols = [self.log.user[e], item, *(feats[f] for f in self.features)]
        return {**dict(zip(self.target_keys, cols, strict=True)), "label": label}

    def build(self, task: EventsTask) -> SparseBatch:
        """The SparseBatch of one task (pure; safe in a worker process)."""
        e, item, label, feats = self.targets(task.positions)
        hist, lengths = self.history(e)
        n = len(e)
        log = self.log
        values = [log.user[e], item, *(feats[f] for f in self.features), log.item[hist],
                  *(log.features[f][hist] for f in self.features),
                  *(v[hist] for v in log.history.values())]
        negatives = self._negatives.draw(task.index, n)
        values += negatives
        ones = np.ones(n, np.int64)
        lens = ([ones] * len(self.target_keys)
                + [lengths] * (len(self.keys) - len(self.target_keys) - len(negatives))
                + [ones] * len(negatives))
        return SparseBatch(
            list(self.keys), torch.from_numpy(np.concatenate(values).astype(np.int64)),
            torch.from_numpy(np.concatenate(lens)), torch.zeros((n, 0), dtype=torch.float32),
            torch.from_numpy(np.ascontiguousarray(label, dtype=np.float32)),
            bad_records=self.bad_records if task.index == 0 else 0, index=task.index,
            task_labels={t: torch.from_numpy(v[task.positions]) for t, v in self._tasks.items()}
            or None, negative_pool=self._negatives.pool_size)

    def task_labels(self) -> dict[str, np.ndarray]:
        """Every sample's label of each task (data.columns.labels; empty without tasks)."""
        return dict(self._tasks)

    def describe(self) -> str:
        """The start-up line: samples, positives, and negatives left undrawn."""
        pos = int((self._label > 0.5).sum())
        said = (", ".join(f"{t} {float(v.mean()) if len(v) else 0.0:.1%} positive"
                          for t, v in self._tasks.items()) if self._tasks else f"{pos:,} positive")
        line = (f"interactions ({self.split}): {self.num_samples:,} samples, {said}, "
                f"from {self.log.num_events:,} events")
        if self.undrawn:
            line += f"; {self.undrawn:,} negatives undrawn (users who saw almost every item)"
        return line + self.dropped.describe(self.events.min_history)


def item_features(log: InteractionLog):  # noqa: ANN202 (a closure over the log)
    """``lookup(feature, items)``: each item's value of a column at its last event."""
    if not log.features:
        return lambda f, items: np.zeros(len(items), np.int64)
    vocab, last = np.unique(log.item[::-1], return_index=True)
    last = log.num_events - 1 - last

    def lookup(f: str, items: np.ndarray) -> np.ndarray:
        at = np.minimum(np.searchsorted(vocab, items), len(vocab) - 1)
        return log.features[f][last[at]]
    return lookup
