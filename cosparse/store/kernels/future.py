"""Future uses: how many batches beyond the pinned window will need an ID, kept in an
open-addressing map of ID -> count (-1 = empty bucket)."""

from __future__ import annotations

import numba
import numpy as np

from cosparse.store.kernels.hashing import EMPTY, bucket, erase_at


@numba.njit(cache=True, nogil=True)
def future_add(keys, vals, ids, delta):
    """vals[id] += delta for unique ``ids`` (inserting at +1, erasing at 0). Returns the change in
    the number of keys. ``vals`` holds -1 for empty buckets; the caller keeps load <= 0.7."""
    mask = np.uint64(keys.shape[0] - 1)
    change = 0
    for i in range(ids.shape[0]):
        k = ids[i]
        b = bucket(k, mask)
        while True:
            v = vals[b]
            if v == EMPTY:
                if delta > 0:
                    keys[b] = k
                    vals[b] = delta
                    change += 1
                break
            if keys[b] == k:
                v += delta
                if v > 0:
                    vals[b] = v
                else:
                    erase_at(keys, vals, b, mask)
                    change -= 1
                break
            b = (b + 1) & np.int64(mask)
    return change


@numba.njit(cache=True, nogil=True)
def future_get(keys, vals, ids, out):
    """out[i] = future uses of ids[i] (0 when absent)."""
    if keys.shape[0] == 0:
        out[:] = 0
        return
    mask = np.uint64(keys.shape[0] - 1)
    for i in range(ids.shape[0]):
        k = ids[i]
        b = bucket(k, mask)
        out[i] = 0
        while True:
            v = vals[b]
            if v == EMPTY:
                break
            if keys[b] == k:
                out[i] = v
                break
            b = (b + 1) & np.int64(mask)
