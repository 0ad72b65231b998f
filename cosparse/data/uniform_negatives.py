"""A retrieval model's mixed negatives (Yang et al., "Mixed Negative Sampling for Learning
Two-tower Neural Networks in Recommendations", WWW 2020): beside the batch's own items, each
sample brings ``k`` items drawn uniformly from the training split's items
(``data.events.uniform_negatives``), as features ``neg{j}_<key>`` for each of the item's keys
(``neg0_item``, ``neg0_cate``, ...: the drawn item and its columns). The model scores every user
of the (global) batch against all of them; the loss's logQ correction accounts for both sources
(``cosparse.nn.retrieval``), for which each batch says how many items it drew from
(``SparseBatch.negative_pool``).

The draws are a function of ``(data.events.seed, split, batch index)`` alone: the same batch
draws the same items in a worker process or the trainer, on any placement, and on a resumed run.
They go through the tables like any feature, so their rows live in whatever tier holds them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np

from cosparse.data.errors import DataError

NEGATIVE = re.compile(r"neg(\d+)_(.+)")


def negative_keys(item_keys: Sequence[str], k: int) -> list[str]:
    """The features of ``k`` negatives of an item read as ``item_keys``: negative j's keys, in
    order, for j < k."""
    return [f"neg{j}_{key}" for j in range(k) for key in item_keys]


def is_negative(feature: str) -> bool:
    """Whether ``feature`` is a uniform negative's (``neg{j}_<key>``)."""
    return NEGATIVE.fullmatch(feature) is not None


def negatives_of(features: Sequence[str], item: Sequence[str]) -> list[list[str]]:
    """Per negative j (while ``features`` has all of them), its features for the item's
    ``item`` features, in that order."""
    out = []
    while all(f"neg{len(out)}_{f}" in features for f in item):
        out.append([f"neg{len(out)}_{f}" for f in item])
    return out


class UniformNegatives:
    """``k`` items per sample, uniform over the training split's distinct items, with the
    item's columns (each item's values at its last event)."""

    def __init__(self, train_items: np.ndarray, k: int, seed: int, salt: int,
                 column_of_items: Callable[[str, np.ndarray], np.ndarray],
                 features: Sequence[str]) -> None:
        """``train_items``: the item of each training event; ``column_of_items(f, items)``:
        the items' values of column ``f``; ``salt``: the split's (0 train, 1 eval)."""
        self.k, self.seed, self.salt = k, seed, salt
        self.pool = np.unique(train_items) if k else np.zeros(0, np.int64)
        if k and self.pool.shape[0] == 0:
            raise DataError("data.events.uniform_negatives: the training split has no items to "
                            "draw negatives from")
        self.columns = {f: column_of_items(f, self.pool) for f in features} if k else {}

    @property
    def pool_size(self) -> int:
        """How many items the draws come from (0: no negatives)."""
        return int(self.pool.shape[0]) if self.k else 0

    def draw(self, batch_index: int, n: int) -> list[np.ndarray]:
        """The ID columns of batch ``batch_index``'s ``n`` samples' negatives, negative-major:
        negative 0's item, then its columns, then negative 1's..."""
        if not self.k:
            return []
        rng = np.random.default_rng([self.seed, self.salt, batch_index])
        at = rng.integers(0, self.pool.shape[0], size=(self.k, n))
        return [col for j in range(self.k)
                for col in (self.pool[at[j]], *(c[at[j]] for c in self.columns.values()))]
