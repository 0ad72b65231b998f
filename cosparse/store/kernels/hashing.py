"""SplitMix64 and the open-addressing primitives every hash table kernel shares: an ID's home
bucket, the empty marker, the probe along a key's run, and backward-shift deletion."""

from __future__ import annotations

import numba
import numpy as np

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
EMPTY = np.int32(-1)  # the value of an empty bucket


@numba.njit(inline="always")
def mix64(x: np.uint64) -> np.uint64:
    """SplitMix64 finaliser: a bijective 64-bit mix."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


@numba.njit(inline="always")
def bucket(key: np.int64, mask: np.uint64) -> np.int64:
    """The home bucket of ``key`` in a table of ``mask + 1`` buckets (a power of two)."""
    return np.int64(mix64(np.uint64(key)) & mask)


@numba.njit(inline="always")
def probe_hashed(keys, vals, k, h, mask):
    """(bucket, value) of key ``k`` (hash ``h``): its bucket and value, or the empty bucket
    that ends its run and ``EMPTY``."""
    b = np.int64(h & mask)
    while True:
        v = vals[b]
        if v == EMPTY or keys[b] == k:
            return b, v
        b = (b + 1) & np.int64(mask)


@numba.njit(inline="always")
def probe(keys, vals, k, mask):
    """``probe_hashed`` of key ``k`` with its own hash."""
    return probe_hashed(keys, vals, k, mix64(np.uint64(k)), mask)


@numba.njit(inline="always")
def first_empty(vals, k, mask):
    """The empty bucket that ends the run of key ``k``, which the map does not hold (an insert
    whose caller knows the key is absent: a rehash, an admission)."""
    b = bucket(k, mask)
    while vals[b] != EMPTY:
        b = (b + 1) & np.int64(mask)
    return b


@numba.njit(inline="always")
def erase_at(keys, vals, b, mask):
    """Empty bucket ``b`` by backward-shift deletion: later members of its probe run move back
    into the hole unless their home bucket lies cyclically in (hole, j]. No tombstones."""
    hole = b
    j = (b + 1) & np.int64(mask)
    while vals[j] != EMPTY:
        home = bucket(keys[j], mask)
        if ((j - home) & np.int64(mask)) >= ((j - hole) & np.int64(mask)):
            keys[hole] = keys[j]
            vals[hole] = vals[j]
            hole = j
        j = (j + 1) & np.int64(mask)
    vals[hole] = EMPTY
