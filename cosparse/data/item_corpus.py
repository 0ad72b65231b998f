"""What ranking the whole item corpus needs from an interaction log's eval split
(``cosparse.data.interactions.InteractionsReader``): every item of the log once, as batches of
the reader's keys (the item and its own columns; the user and the histories empty), and per
eval sample its target's corpus index and the items its user interacted with before it (left
out of its ranking), with each item's count in the training split (the popularity baseline).
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
