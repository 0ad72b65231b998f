"""Kernels of the ID -> slot map: open addressing with linear probing over int64 keys and int32
slots (-1 = empty), the capacity a power of two."""

from __future__ import annotations

import numba
import numpy as np

from cosparse.store.kernels.hashing import EMPTY, erase_at, first_empty, probe


@numba.njit(cache=True, nogil=True)
def map_lookup_or_insert(keys, vals, ids, out_slots, next_slot, limit):
    """For each id: its slot, inserting missing ids with slots next_slot, next_slot+1, ...

    keys: int64 [cap], vals: int32 [cap] (-1 = empty), cap a power of two.
    Stops inserting once ``limit`` slots exist and returns -1 in that case. Returns the new
    next_slot. ``out_slots`` gets the slot of each id.
    """
    mask = np.uint64(keys.shape[0] - 1)
    for i in range(ids.shape[0]):
        k = ids[i]
        b, v = probe(keys, vals, k, mask)
        if v != EMPTY:
            out_slots[i] = v
            continue
        if next_slot >= limit:
            return -1
        keys[b] = k
        vals[b] = next_slot
        out_slots[i] = next_slot
        next_slot += 1
    return next_slot


@numba.njit(cache=True, nogil=True)
def map_lookup(keys, vals, ids, out_slots):
    """Slot of each id, or -1 when absent. Returns the number found."""
    mask = np.uint64(keys.shape[0] - 1)
    found = 0
    for i in range(ids.shape[0]):
        _, v = probe(keys, vals, ids[i], mask)
        out_slots[i] = v  # (EMPTY is -1)
        if v != EMPTY:
            found += 1
    return found


@numba.njit(cache=True, nogil=True)
def map_rehash(old_keys, old_vals, new_keys, new_vals):
    mask = np.uint64(new_keys.shape[0] - 1)
    for i in range(old_keys.shape[0]):
        v = old_vals[i]
        if v == EMPTY:
            continue
        k = old_keys[i]
        b = first_empty(new_vals, k, mask)
        new_keys[b] = k
        new_vals[b] = v


@numba.njit(cache=True, nogil=True)
def map_insert(keys, vals, ids, slots):
    """Insert absent ids with the given slots (the caller guarantees absence and room)."""
    mask = np.uint64(keys.shape[0] - 1)
    for i in range(ids.shape[0]):
        b = first_empty(vals, ids[i], mask)
        keys[b] = ids[i]
        vals[b] = slots[i]


@numba.njit(cache=True, nogil=True)
def map_erase(keys, vals, ids):
    """Erase ids (backward-shift deletion). Returns the number erased."""
    mask = np.uint64(keys.shape[0] - 1)
    erased = 0
    for i in range(ids.shape[0]):
        b, v = probe(keys, vals, ids[i], mask)
        if v != EMPTY:
            erase_at(keys, vals, b, mask)
            erased += 1
    return erased
