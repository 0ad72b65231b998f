"""Per-table, per-batch ID prep: unique IDs, the inverse index and the transposed bag index.

``table_ids`` is a pure function of the batch, so it runs ahead of training on a background
thread, or in a data worker (architecture B), whose result the trainer then uses as it is.
``map_ids`` is the one implementation of a table's ID mapping (the optional ``hash_size``
modulo); ``row_owner`` names the shard that owns a row key under row-wise sharding.
Scratch buffers are reused across batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cosparse.batch import SparseBatch
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
        self._scratch_pairs = np.zeros(0, dtype=np.int64)
        self._shift = np.uint64(64)

    def _scratch(self, n: int) -> None:
        bits = max(4, int(2 * n).bit_length())
        if self._scratch_pairs.shape[0] < 2 << bits:
            self._scratch_pairs = np.full(2 << bits, -1, dtype=np.int64)
            self._shift = np.uint64(64 - bits)

    def _dedup(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        n = ids.shape[0]
        self._scratch(n)
        unique = np.empty(n, dtype=np.int64)
        inverse = np.empty(n, dtype=np.int64)
        counts = np.empty(n, dtype=np.int64)
        used = np.empty(n, dtype=np.int64)
        u = kernels.dedup(ids, self._scratch_pairs, self._shift, used, unique, inverse, counts)
        return unique[:u], inverse, counts

    def unique(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Unique IDs in first-occurrence order and the inverse index."""
        unique, inverse, _ = self._dedup(ids)
        return unique, inverse

    def prepare(self, ids: np.ndarray, offsets: np.ndarray, mean: bool) -> TableIds:
        """The ID work of one table: dedup, then the transposed index from its counts."""
        unique, inverse, counts = self._dedup(ids)
        u, n = unique.shape[0], inverse.shape[0]
        t_offsets = np.empty(u + 1, dtype=np.int64)
        t_bags = np.empty(n, dtype=np.int64)
        t_weights = np.empty(n, dtype=np.float32)
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        kernels.transpose_counted(inverse, offsets, u, counts, mean, t_offsets, t_bags, t_weights)
        return TableIds(unique, inverse, offsets, t_offsets, t_bags, t_weights)


def with_bags(unique: np.ndarray, inverse: np.ndarray, offsets: np.ndarray, mean: bool
              ) -> TableIds:
    """The ID work from a dedup's ``unique`` and ``inverse`` and the bag ``offsets``: the
    transposed bag index that the pooled lookup's backward uses."""
    u, n = unique.shape[0], inverse.shape[0]
    t_offsets = np.empty(u + 1, dtype=np.int64)
    t_bags = np.empty(n, dtype=np.int64)
    t_weights = np.empty(n, dtype=np.float32)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    inverse = np.ascontiguousarray(inverse, dtype=np.int64)
    kernels.transpose_bags(inverse, offsets, u, mean, t_offsets, t_bags, t_weights)
    return TableIds(unique, inverse, offsets, t_offsets, t_bags, t_weights)


def map_ids(ids: np.ndarray, hash_size: int | None) -> np.ndarray:
    """A table's row keys for raw IDs: the optional modulo of ``hash_size``, else the IDs (IDs
    already in ``0 .. hash_size - 1`` are their own keys: two reductions instead of a division)."""
    if hash_size is None or (ids.shape[0] and ids.min() >= 0 and ids.max() < hash_size):
        return ids
    return np.remainder(ids, hash_size)


_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def row_owner(keys: np.ndarray, owners: int) -> np.ndarray:
    """The shard (0 .. owners-1) of each row key: splitmix64 of the key, modulo ``owners``.

    A pure function of the key, so a dynamic vocabulary's new row has exactly one owner, the same
    on every rank, in every run and after resharding."""
    if owners == 1:
        return np.zeros(keys.shape[0], dtype=np.int64)
    with np.errstate(over="ignore"):
        z = keys.astype(np.uint64, copy=True)
        z ^= z >> np.uint64(30)
        z *= _M1
        z ^= z >> np.uint64(27)
        z *= _M2
        z ^= z >> np.uint64(31)
    return (z % np.uint64(owners)).astype(np.int64)


def bag_offsets(lengths: np.ndarray, n_ids: int, pooling: str) -> np.ndarray:
    """Bag offsets of a table's IDs from the bag ``lengths`` of its features, in order; with
    ``pooling: none`` every ID is its own bag, so rows come back one per ID."""
    if pooling == "none":
        return np.arange(n_ids + 1, dtype=np.int64)
    out = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def table_parts(batch: SparseBatch, features: list[str] | tuple[str, ...]
                ) -> tuple[np.ndarray, np.ndarray]:
    """(IDs, bag lengths) of one table's ``features`` in ``batch``, feature after feature."""
    b = batch.batch_size
    values, lengths, offsets = batch.values.numpy(), batch.lengths.numpy(), batch.offsets.numpy()
    ids, lens = [], []
    for f in features:
        k = batch.keys.index(f)
        ids.append(values[offsets[k * b] : offsets[(k + 1) * b]])
        lens.append(lengths[k * b : (k + 1) * b])
    if len(ids) == 1:
        return ids[0], lens[0]
    return np.concatenate(ids), np.concatenate(lens)


def table_ids(batch: SparseBatch, features: list[str] | tuple[str, ...], hash_size: int | None,
              pooling: str, deduper: Deduper) -> TableIds:
    """The ID work of one table (``features``, in order) for ``batch``."""
    ids, lens = table_parts(batch, features)
    bags = bag_offsets(lens, ids.shape[0], pooling)
    return deduper.prepare(map_ids(ids, hash_size), bags, pooling == "mean")
