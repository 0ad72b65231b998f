"""Per-batch ID kernels: dedup with reused scratch, and the transposed (unique row -> bags) index
that sums each row's gradient in sample order."""

from __future__ import annotations

import numba
import numpy as np

from cosparse.store.kernels.hashing import EMPTY, bucket


@numba.njit(cache=True, nogil=True)
def dedup(ids, scratch_keys, scratch_vals, used, out_unique, out_inverse):
    """Unique ids in first-occurrence order and the inverse index (ids[j] == unique[inverse[j]]).

    scratch_vals must be all -1 on entry and is restored to all -1 on exit, so the scratch is
    reused across batches without clearing it. ``used`` has room for len(ids) positions.
    Returns the number of unique ids.
    """
    mask = np.uint64(scratch_keys.shape[0] - 1)
    n_unique = 0
    for j in range(ids.shape[0]):
        k = ids[j]
        b = bucket(k, mask)
        while True:
            v = scratch_vals[b]
            if v == EMPTY:
                scratch_keys[b] = k
                scratch_vals[b] = n_unique
                used[n_unique] = b
                out_unique[n_unique] = k
                out_inverse[j] = n_unique
                n_unique += 1
                break
            if scratch_keys[b] == k:
                out_inverse[j] = v
                break
            b = (b + 1) & np.int64(mask)
    for u in range(n_unique):
        scratch_vals[used[u]] = EMPTY
    return n_unique


@numba.njit(cache=True, nogil=True)
def transpose_bags(inverse, offsets, n_unique, mean, out_toff, out_tbag, out_tweight):
    """Transposed (unique row -> bags) CSR index, built with a stable counting sort.

    For unique row u, out_tbag[out_toff[u]:out_toff[u+1]] lists the bag of each of its
    occurrences in sample order, so a row's gradient is always summed in sample order.
    out_tweight holds 1/len(bag) when ``mean`` else 1.
    """
    n_bags = offsets.shape[0] - 1
    for u in range(n_unique + 1):
        out_toff[u] = 0
    for j in range(inverse.shape[0]):
        out_toff[inverse[j] + 1] += 1
    for u in range(n_unique):
        out_toff[u + 1] += out_toff[u]
    cursor = out_toff[:n_unique].copy()
    for b in range(n_bags):
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
