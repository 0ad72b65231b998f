"""Per-batch ID kernels: dedup with reused scratch, and the transposed (unique row -> bags) index
that sums each row's gradient in sample order."""

from __future__ import annotations

import numba
import numpy as np

_FIB = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: the scratch is this batch's only


@numba.njit(cache=True, nogil=True)
def dedup(ids, scratch, shift, used, out_unique, out_inverse, out_counts):
    """Unique ids in first-occurrence order, the inverse index (ids[j] == unique[inverse[j]])
    and each unique id's count of occurrences (which the transposed index is built from).

    ``scratch`` is [2 * 2**bits] int64 (key, value) pairs side by side, so that a probe reads one
    cache line, with ``shift = 64 - bits``; every value must be -1 on entry and is restored to -1
    on exit, so the scratch is reused across batches without clearing it. ``used`` has room for
    len(ids) positions. Returns the number of unique ids.
    """
    mask = np.int64((scratch.shape[0] >> 1) - 1)
    n_unique = 0
    for j in range(ids.shape[0]):
        k = ids[j]
        b = np.int64((np.uint64(k) * _FIB) >> shift)
        while True:
            v = scratch[2 * b + 1]
            if v < 0:
                scratch[2 * b] = k
                scratch[2 * b + 1] = n_unique
                used[n_unique] = b
                out_unique[n_unique] = k
                out_inverse[j] = n_unique
                out_counts[n_unique] = 1
                n_unique += 1
                break
            if scratch[2 * b] == k:
                out_inverse[j] = v
                out_counts[v] += 1
                break
            b = (b + 1) & mask
    for u in range(n_unique):
        scratch[2 * used[u] + 1] = -1
    return n_unique


@numba.njit(cache=True, nogil=True)
def transpose_counted(inverse, offsets, n_unique, counts, mean, out_toff, out_tbag, out_tweight):
    """``transpose_bags`` given each unique row's count of occurrences (``dedup``'s), which
    becomes the scatter's cursor (overwritten)."""
    out_toff[0] = 0
    for u in range(n_unique):
        out_toff[u + 1] = out_toff[u] + counts[u]
        counts[u] = out_toff[u]
    _scatter_bags(inverse, offsets, mean, counts, out_tbag, out_tweight)


@numba.njit(inline="always")
def _scatter_bags(inverse, offsets, mean, cursor, out_tbag, out_tweight):
    """Each occurrence's bag (and weight) at its row's cursor, bag after bag: sample order."""
    for b in range(offsets.shape[0] - 1):
        lo = offsets[b]
        hi = offsets[b + 1]
        w = np.float32(1.0)
        if mean and hi > lo:
            w = np.float32(1.0) / np.float32(hi - lo)
        for j in range(lo, hi):
            u = inverse[j]
            p = cursor[u]
            out_tbag[p] = b
            out_tweight[p] = w
            cursor[u] = p + 1


@numba.njit(cache=True, nogil=True)
def transpose_bags(inverse, offsets, n_unique, mean, out_toff, out_tbag, out_tweight):
    """Transposed (unique row -> bags) CSR index, built with a stable counting sort.

    For unique row u, out_tbag[out_toff[u]:out_toff[u+1]] lists the bag of each of its
    occurrences in sample order, so a row's gradient is always summed in sample order.
    out_tweight holds 1/len(bag) when ``mean`` else 1.
    """
    for u in range(n_unique + 1):
        out_toff[u] = 0
    for j in range(inverse.shape[0]):
        out_toff[inverse[j] + 1] += 1
    for u in range(n_unique):
        out_toff[u + 1] += out_toff[u]
    cursor = out_toff[:n_unique].copy()
    _scatter_bags(inverse, offsets, mean, cursor, out_tbag, out_tweight)
