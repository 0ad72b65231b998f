"""Per-table, per-batch ID prep: unique IDs, the inverse index and the transposed bag index.

``prepare_table_ids`` is a pure function of the batch, so it can run ahead of training on a
background thread or in a data worker. Scratch buffers are reused across batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cosparse.store import kernels


@dataclass
class TableIds:
    """The ID work for one table of one batch (all numpy, host side)."""

    unique: np.ndarray  # int64 [U] raw IDs, first-occurrence order
    inverse: np.ndarray  # int64 [N] position of each ID occurrence in ``unique``
    offsets: np.ndarray  # int64 [num_bags + 1] bag offsets into ``inverse``
    t_offsets: np.ndarray  # int64 [U + 1] transposed CSR: occurrences of each unique row
    t_bags: np.ndarray  # int64 [N] the bag of each occurrence, in sample order per row
    t_weights: np.ndarray  # float32 [N] 1/len(bag) for mean pooling, else 1

    @property
    def num_unique(self) -> int:
        return int(self.unique.shape[0])


class Deduper:
    """Dedup with a reusable hash scratch (grown on demand, never cleared per batch)."""

    def __init__(self) -> None:
        self._keys = np.zeros(0, dtype=np.int64)
        self._vals = np.zeros(0, dtype=np.int32)

    def _scratch(self, n: int) -> None:
        cap = 1 << max(4, int(2 * n).bit_length())
        if self._keys.shape[0] < cap:
            self._keys = np.zeros(cap, dtype=np.int64)
            self._vals = np.full(cap, -1, dtype=np.int32)

    def unique(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        n = ids.shape[0]
        self._scratch(n)
        unique = np.empty(n, dtype=np.int64)
        inverse = np.empty(n, dtype=np.int64)
        used = np.empty(n, dtype=np.int64)
        u = kernels.dedup(ids, self._keys, self._vals, used, unique, inverse)
        return unique[:u], inverse

    def prepare(self, ids: np.ndarray, offsets: np.ndarray, mean: bool) -> TableIds:
        unique, inverse = self.unique(ids)
        u = unique.shape[0]
        n = inverse.shape[0]
        t_offsets = np.empty(u + 1, dtype=np.int64)
        t_bags = np.empty(n, dtype=np.int64)
        t_weights = np.empty(n, dtype=np.float32)
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        kernels.transpose_bags(inverse, offsets, u, mean, t_offsets, t_bags, t_weights)
        return TableIds(unique, inverse, offsets, t_offsets, t_bags, t_weights)
