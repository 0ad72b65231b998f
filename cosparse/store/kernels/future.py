"""The planning horizon: for each ID, the tag of the latest batch in the horizon that needs it,
in an open-addressing map of ID -> tag (-1 = empty bucket).

Batches get tags 1, 2, 3, ... as they enter the horizon and leave it in the same order, so after
``left`` batches have left, an ID is needed by a batch still in the horizon exactly when its tag
is above ``left``. A batch entering writes its tag over its IDs' entries; a batch leaving changes
nothing (entries go stale in place and are dropped when the map is rebuilt).
"""

from __future__ import annotations

import numba
import numpy as np

from cosparse.store.kernels.hashing import EMPTY, first_empty, probe


@numba.njit(cache=True, nogil=True)
def future_enter(keys, vals, ids, tag, map_keys, map_vals, wanted):
    """A batch with tag ``tag`` enters the horizon: ``vals[id] = tag`` for its unique ``ids``,
    and ``wanted[slot] = tag`` for those the device map (``map_keys``/``map_vals``) holds.
    Returns the number of keys inserted; the caller keeps the load <= 0.7.

    Hand-written (numba): one pass over the batch's IDs probing both maps, where numpy would
    need a lookup, a mask and a scatter per map."""
    mask = np.uint64(keys.shape[0] - 1)
    dmask = np.uint64(map_keys.shape[0] - 1)
    added = 0
    for i in range(ids.shape[0]):
        k = ids[i]
        b, v = probe(keys, vals, k, mask)
        if v == EMPTY:
            keys[b] = k
            added += 1
        vals[b] = tag
        _, slot = probe(map_keys, map_vals, k, dmask)
        if slot != EMPTY:
            wanted[slot] = tag
    return added


@numba.njit(cache=True, nogil=True)
def future_rehash(old_keys, old_vals, new_keys, new_vals, floor):
    """Copy the entries whose tag is above ``floor`` (still in the horizon) into an empty map;
    returns how many."""
    mask = np.uint64(new_keys.shape[0] - 1)
    n = 0
    for i in range(old_keys.shape[0]):
        v = old_vals[i]
        if v <= floor:  # empty (-1) or stale
            continue
        k = old_keys[i]
        b = first_empty(new_vals, k, mask)
        new_keys[b] = k
        new_vals[b] = v
        n += 1
    return n


@numba.njit(cache=True, nogil=True)
def future_get(keys, vals, ids, out):
    """out[i] = the tag of ids[i] (0 when absent)."""
    if keys.shape[0] == 0:
        out[:] = 0
        return
    mask = np.uint64(keys.shape[0] - 1)
    for i in range(ids.shape[0]):
        _, v = probe(keys, vals, ids[i], mask)
        out[i] = 0 if v == EMPTY else v
