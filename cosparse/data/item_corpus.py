"""What ranking the whole item corpus needs from an interaction log's eval split
(``cosparse.data.interactions.InteractionsReader``): every item of the log once, as batches of
the reader's keys (the item and its own columns; the user and the histories empty), and per
eval sample its target's corpus index and the items its user interacted with before it (left
out of its ranking), with each item's count in the training split (the popularity baseline),
and the training split's item-to-next-item transitions with each eval sample's most recent item
(the transitions baseline, which learns no item embedding).
"""

from __future__ import annotations

import numpy as np
import torch

from cosparse.batch import SparseBatch
from cosparse.data.interactions import InteractionsReader, item_features


def item_corpus(reader: InteractionsReader, batch_size: int
                ) -> tuple[np.ndarray, list[SparseBatch]]:
    """The log's items in ID order, and batches of them: one ID each for the item and its
    columns (their values at the item's last event), no ID for every other key."""
    ids = np.unique(reader.log.item)
    column = item_features(reader.log)
    item_keys = reader.target_keys[1:]  # (the item, then its columns, as the reader names them)
    batches = []
    for lo in range(0, ids.shape[0], batch_size):
        part = ids[lo:lo + batch_size]
        n = part.shape[0]
        values = [part, *(column(f, part) for f in reader.features)]
        lengths = [np.ones(n, np.int64) if k in item_keys else np.zeros(n, np.int64)
                   for k in reader.keys]
        batches.append(SparseBatch(
            list(reader.keys), torch.from_numpy(np.concatenate(values).astype(np.int64)),
            torch.from_numpy(np.concatenate(lengths)), torch.zeros((n, 0)),
            torch.ones(n)))
    return ids, batches


def ranking_inputs(reader: InteractionsReader, corpus: np.ndarray
                   ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray], np.ndarray]:
    """Per eval sample in order: its target's index in ``corpus`` (sorted IDs); the corpus
    indices of its user's earlier items (flat, and a count per sample); and each corpus item's
    count among the training split's events."""
    events = reader.target_events()
    targets = np.searchsorted(corpus, reader.log.item[events])
    earlier, counts = reader.earlier_events(events)
    seen = np.searchsorted(corpus, reader.log.item[earlier]).astype(np.int64)
    train_items = reader.log.item[reader.in_train]
    popularity = np.bincount(np.searchsorted(corpus, train_items), minlength=corpus.shape[0])
    return targets, (seen, counts), popularity


def transitions(reader: InteractionsReader, corpus: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The training split's transitions, as CSR over corpus indices: ``indptr``, ``indices``
    and ``counts`` (how often a user's event of item ``row`` was followed by their next event
    of item ``indices``, both events in the training split); and per eval sample, its user's
    most recent earlier item (a corpus index; -1: no history)."""
    log = reader.log
    n = len(corpus)
    at = np.searchsorted(corpus, log.item)
    same_user = log.user[1:] == log.user[:-1]
    both_train = reader.in_train[1:] & reader.in_train[:-1]
    keep = np.flatnonzero(same_user & both_train)
    pairs, counts = np.unique(at[keep] * n + at[keep + 1], return_counts=True)
    rows, cols = pairs // n, pairs % n
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    hist, lengths = reader.history(reader.target_events())
    first = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    last = np.where(lengths > 0, at[hist[np.minimum(first, max(len(hist) - 1, 0))]]
                    if len(hist) else -1, -1)
    return indptr, cols.astype(np.int64), counts.astype(np.int64), last.astype(np.int64)
