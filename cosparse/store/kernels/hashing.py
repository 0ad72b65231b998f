"""SplitMix64 and the open-addressing primitives every hash table kernel shares: an ID's home
bucket, the empty marker, and backward-shift deletion."""

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
