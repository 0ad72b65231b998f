"""``reader: interactions``: behaviour-sequence samples of any interaction log.

One sample per target event (its user, its item and the item's own columns), with the user's
most recent ``data.events.max_len`` events strictly before it as histories (``hist_item`` and
``hist_<feature>``, most recent first), as the Taobao reader builds them. Targets need
``data.events.min_history`` earlier events. The split is by time (the last ``eval_fraction`` of
events, as Taobao's) or ``data.split: {by: last_per_user}`` (leave-last-out). Labels come from the
label column, or every event is a positive and ``data.negatives`` adds sampled negatives (the
same user, time and history, another item); negatives are never events, so never in a history.
Train samples are shuffled by ``data.events.shuffle`` (whole split) or ``data.shuffle``
(windows), eval samples keep time order, each positive followed by its negatives.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from cosparse.batch import SparseBatch
from cosparse.config import DataConfig
from cosparse.data.errors import DataError, empty_split_message
from cosparse.data.events import EventsTask, index_events
from cosparse.data.shuffle import shuffled, window_batches
from cosparse.data.split import Split, num_batches, split_range
from cosparse.features.event_source import reversed_range_index
from cosparse.features.interaction_log import InteractionLog, load_interactions
from cosparse.features.negatives import sample_negatives


def eval_events(log: InteractionLog, data: DataConfig, time_rank: np.ndarray) -> np.ndarray:
    """Which events are eval targets."""
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
    """One split of an interaction log as SparseBatches (see the module docstring)."""

    def __init__(self, data: DataConfig, split: Split = "train") -> None:
        self.path = str(data.path)
        self.batch_size = data.batch_size
        self.split: Split = split
        log = self.log = load_interactions(data)
        ev = data.events
        ix = index_events(log.user, log.time, log.row)
        self._lo = np.maximum(ix.user_start, ix.run_start - ev.max_len)
        self._hi = ix.run_start
        is_eval = eval_events(log, data, ix.time_rank)
        in_split = is_eval if split == "eval" else ~is_eval
        pos = np.flatnonzero(in_split & (ix.run_start - ix.user_start >= ev.min_history))
        pos = pos[np.argsort(ix.time_rank[pos], kind="stable")]  # time order
        if split == "train" and pos.shape[0] == 0:
            if not in_split.any():
                raise DataError(empty_split_message(self.path, log.num_events, "events",
                                                    data.eval_fraction))
            raise DataError(f"{self.path}: no training samples: no training event has "
                            f"data.events.min_history ({ev.min_history}) earlier events")
        label = np.ones(len(pos), np.float32) if log.label is None else log.label[pos]
        event, item, neg = pos, log.item[pos], np.zeros(len(pos), np.int64)
        self.undrawn = 0
        if data.negatives is not None:
            n = sample_negatives(log.user, log.item, log.time, pos[label > 0.5],
                                 np.flatnonzero(~is_eval), data.negatives,
                                 salt=0 if split == "train" else 1)
            self.undrawn = n.undrawn
            rank = np.concatenate([np.zeros(len(pos), np.int64), np.ones(len(n.event), np.int64)])
            event = np.concatenate([pos, n.event])
            item = np.concatenate([item, n.item])
            label = np.concatenate([label, np.zeros(len(n.event), np.float32)])
            neg = rank
            order = np.lexsort((rank, ix.time_rank[event]))  # each positive, then its negatives
            event, item, label, neg = event[order], item[order], label[order], neg[order]
        feature_of_item = _item_features(log)
        self._feats = {f: np.where(neg == 1, feature_of_item(f, item), log.features[f][event])
                       for f in log.features}
        order = np.arange(len(event))
        if split == "train" and ev.shuffle:
            order = np.random.default_rng(ev.seed).permutation(len(event))
        elif split == "train" and data.shuffle is not None:
            order = shuffled(order, window_batches(data.shuffle.buffer, self.batch_size)
                             * self.batch_size, data.shuffle.seed)
        self._event, self._item, self._label = event[order], item[order], label[order]
        self._feats = {f: v[order] for f, v in self._feats.items()}
        self.features = list(log.features)
        self.keys: list[str] = (["user", "item", *self.features, "hist_item"]
                                + [f"hist_{f}" for f in self.features])
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

    def build(self, task: EventsTask) -> SparseBatch:
        """The SparseBatch of one task (pure; safe in a worker process)."""
        s = task.positions
        e = self._event[s]
        lo, hi = self._lo[e], self._hi[e]
        hist = reversed_range_index(lo, hi)
        n = len(s)
        ones = np.ones(n, np.int64)
        lengths = (hi - lo).astype(np.int64)
        values = [self.log.user[e], self._item[s], *(self._feats[f][s] for f in self.features),
                  self.log.item[hist], *(self.log.features[f][hist] for f in self.features)]
        lens = [ones] * (2 + len(self.features)) + [lengths] * (1 + len(self.features))
        return SparseBatch(
            list(self.keys), torch.from_numpy(np.concatenate(values).astype(np.int64)),
            torch.from_numpy(np.concatenate(lens)), torch.zeros((n, 0), dtype=torch.float32),
            torch.from_numpy(np.ascontiguousarray(self._label[s], dtype=np.float32)),
            bad_records=self.bad_records if task.index == 0 else 0, index=task.index)

    def describe(self) -> str:
        """The start-up line: samples, positives, and negatives left undrawn."""
        pos = int((self._label > 0.5).sum())
        line = (f"interactions ({self.split}): {self.num_samples:,} samples, {pos:,} positive, "
                f"from {self.log.num_events:,} events")
        if self.undrawn:
            line += f"; {self.undrawn:,} negatives undrawn (users who saw almost every item)"
        return line


def _item_features(log: InteractionLog):  # noqa: ANN202 (a closure over the log)
    """``lookup(feature, items)``: each item's value of a feature at its last event."""
    if not log.features:
        return lambda f, items: np.zeros(len(items), np.int64)
    vocab, last = np.unique(log.item[::-1], return_index=True)
    last = log.num_events - 1 - last

    def lookup(f: str, items: np.ndarray) -> np.ndarray:
        at = np.minimum(np.searchsorted(vocab, items), len(vocab) - 1)
        return log.features[f][last[at]]
    return lookup
