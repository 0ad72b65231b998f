"""Numba kernels of the feature transforms: seeded 64-bit hashing of ints, strings and crosses,
sequence truncation/padding and time-windowed history. They take and return plain arrays and run
without fastmath, so results are identical across runs and processes.
"""

from __future__ import annotations

import numba
import numpy as np

_MASK63 = np.uint64(0x7FFFFFFFFFFFFFFF)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


@numba.njit(cache=True)
def _mix64(z: np.uint64) -> np.uint64:
    """splitmix64 finaliser: a bijection of uint64."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@numba.njit(cache=True)
def _seed_key(seed: int) -> np.uint64:
    return _mix64(np.uint64(seed) * _GOLDEN + _GOLDEN)


@numba.njit(cache=True)
def _finish(h: np.uint64, buckets: int) -> np.int64:
    x = np.int64(h & _MASK63)
    if buckets > 0:
        x = x % buckets
    return x


@numba.njit(cache=True)
def hash_ints(values: np.ndarray, seed: int, buckets: int) -> np.ndarray:
    """Seeded hash of int64 values -> non-negative int64 (in [0, buckets) when buckets > 0)."""
    key = _seed_key(seed)
    out = np.empty(values.shape[0], np.int64)
    for i in range(values.shape[0]):
        out[i] = _finish(_mix64(np.uint64(values[i]) ^ key), buckets)
    return out


@numba.njit(cache=True)
def hash_strings(data: np.ndarray, offsets: np.ndarray, seed: int, buckets: int) -> np.ndarray:
    """Seeded hash of strings (uint8 ``data``, int64 ``offsets`` [n + 1]): FNV-1a then a mix."""
    key = _seed_key(seed)
    n = offsets.shape[0] - 1
    out = np.empty(n, np.int64)
    for i in range(n):
        h = _FNV_OFFSET ^ key
        for j in range(offsets[i], offsets[i + 1]):
            h = (h ^ np.uint64(data[j])) * _FNV_PRIME
        h = h ^ np.uint64(offsets[i + 1] - offsets[i])
        out[i] = _finish(_mix64(h), buckets)
    return out


@numba.njit(cache=True)
def hash_cross(ids: np.ndarray, seed: int, buckets: int) -> np.ndarray:
    """Row-wise seeded hash of ``k`` IDs per row (``ids`` int64 [k, n]) -> int64 [n]."""
    key = _seed_key(seed)
    k, n = ids.shape
    out = np.empty(n, np.int64)
    for i in range(n):
        h = key
        for j in range(k):
            h = _mix64(h ^ (np.uint64(ids[j, i]) + _GOLDEN + (h << np.uint64(6)) + (h >> np.uint64(2))))
        out[i] = _finish(h, buckets)
    return out


@numba.njit(cache=True)
def truncate_index(lengths: np.ndarray, max_len: int, keep_first: bool = False
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Keep the last (``keep_first``: the first) ``max_len`` elements of each row. Returns
    (element indices kept, new lengths)."""
    n = lengths.shape[0]
    new_len = np.minimum(lengths, max_len)
    total = 0
    for i in range(n):
        total += new_len[i]
    idx = np.empty(total, np.int64)
    start = 0
    k = 0
    for i in range(n):
        first = start if keep_first else start + lengths[i] - new_len[i]
        for j in range(new_len[i]):
            idx[k] = first + j
            k += 1
        start += lengths[i]
    return idx, new_len


@numba.njit(cache=True)
def pad_rows(values: np.ndarray, lengths: np.ndarray, max_len: int, pad_value: int) -> np.ndarray:
    """Rows of at most ``max_len`` elements padded at the end to exactly ``max_len`` -> flat [n*max_len]."""
    n = lengths.shape[0]
    out = np.full(n * max_len, pad_value, values.dtype)
    k = 0
    for i in range(n):
        for j in range(lengths[i]):
            out[i * max_len + j] = values[k]
            k += 1
    return out


@numba.njit(cache=True)
def history_index(lengths: np.ndarray, times: np.ndarray, ts: np.ndarray, ts_present: np.ndarray,
                  window: int, max_len: int, keep_first: bool = False
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the elements whose time t satisfies ts - window <= t < ts, the last (``keep_first``:
    the first) ``max_len`` of them in sequence order (``max_len`` <= 0: all). A row with a
    missing ``ts`` keeps nothing. Returns (element indices kept, new lengths)."""
    n = lengths.shape[0]
    keep = np.zeros(times.shape[0], np.bool_)
    new_len = np.zeros(n, np.int64)
    start = 0
    for i in range(n):
        if ts_present[i]:
            lo = ts[i] - window
            c = 0
            first, stop, step = start + lengths[i] - 1, start - 1, -1
            if keep_first:
                first, stop, step = start, start + lengths[i], 1
            for j in range(first, stop, step):
                if max_len > 0 and c >= max_len:
                    break
                t = times[j]
                if t >= lo and t < ts[i]:
                    keep[j] = True
                    c += 1
            new_len[i] = c
        start += lengths[i]
    return np.flatnonzero(keep), new_len
