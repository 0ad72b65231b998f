"""Admission: a count-min sketch with conservative update, bounded whatever the number of
distinct IDs."""

from __future__ import annotations

import numba
import numpy as np

from cosparse.store.kernels.hashing import GOLDEN, mix64


@numba.njit(cache=True, nogil=True)
def cms_observe(sketch, ids, min_count, out_admitted):
    """Count one sighting of each id; admitted once its (over-)estimated count reaches min_count.

    ``sketch`` is uint32 [depth, width] with width a power of two; memory stays bounded whatever
    the number of distinct IDs. Returns the number admitted.
    """
    depth = sketch.shape[0]
    mask = np.uint64(sketch.shape[1] - 1)
    n_admitted = 0
    for i in range(ids.shape[0]):
        x = np.uint64(ids[i])
        est = np.uint32(0xFFFFFFFF)
        for d in range(depth):
            b = np.int64(mix64(x + np.uint64(d + 1) * GOLDEN) & mask)
            if sketch[d, b] < est:
                est = sketch[d, b]
        new = est + np.uint32(1) if est < np.uint32(0xFFFFFFFF) else est
        for d in range(depth):
            b = np.int64(mix64(x + np.uint64(d + 1) * GOLDEN) & mask)
            if sketch[d, b] < new:
                sketch[d, b] = new
        ok = new >= min_count
        out_admitted[i] = ok
        if ok:
            n_admitted += 1
    return n_admitted
