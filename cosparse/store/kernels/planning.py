"""A device tier's per-batch bookkeeping in one pass each: the hits of a plan (looked up and
pinned), and the admission of its misses with the access of all its rows."""

from __future__ import annotations

import numba
import numpy as np

from cosparse.store.kernels.hashing import EMPTY, first_empty, probe


@numba.njit(cache=True, nogil=True)
def plan_hits(map_keys, map_vals, ids, slots, pins):
    """slots[i] = the slot of ids[i] in the ID -> slot map, -1 for a miss; each hit is pinned.
    Returns the number of hits.

    Hand-written (numba): one pass instead of a lookup, a hit mask, a fancy-indexed gather and
    a pin kernel, on the planner thread for every batch and table."""
    mask = np.uint64(map_keys.shape[0] - 1)
    hits = 0
    for i in range(ids.shape[0]):
        _, v = probe(map_keys, map_vals, ids[i], mask)
        slots[i] = v  # (EMPTY is -1)
        if v != EMPTY:
            pins[v] += 1
            hits += 1
    return hits


@numba.njit(cache=True, nogil=True)
def admit(map_keys, map_vals, miss_ids, miss_slots, in_counts, in_last, in_dirty, fut_keys,
          fut_vals, slot_ids, occupied, dirty, pins, wanted, counts, last, batch_slots, now,
          log_decay, train_dirty):
    """Admit a batch's filled misses into their reserved slots (the map has room: the caller
    reserved it), then record the access of every row of the batch.

    A miss gets its ID, occupancy, the hotness and dirty bit its row source said, one pin (its
    batch) and the horizon tag of its ID (``fut_*``, 0 when absent). Then each of
    ``batch_slots``: the decayed count and last access as ``eviction.touch`` computes them
    (bit for bit: exp of the same float64 product, looked up by age), and the dirty bit when
    ``train_dirty`` (the batch will train the row).

    Hand-written (numba): one pass over the misses and one over the batch, where numpy needs a
    scatter per metadata array, a map insert, a horizon lookup, a pin pass and a touch pass."""
    mask = np.uint64(map_keys.shape[0] - 1)
    fmask = np.uint64(fut_keys.shape[0] - 1)
    for i in range(miss_ids.shape[0]):
        k = miss_ids[i]
        s = miss_slots[i]
        b = first_empty(map_vals, k, mask)
        map_keys[b] = k
        map_vals[b] = s
        slot_ids[s] = k
        occupied[s] = True
        dirty[s] = in_dirty[i]
        pins[s] = 1
        counts[s] = in_counts[i]
        last[s] = in_last[i]
        tag = 0
        if fut_keys.shape[0]:
            _, v = probe(fut_keys, fut_vals, k, fmask)
            if v != EMPTY:
                tag = v
        wanted[s] = tag
    ages = 64
    decay = np.empty(ages, dtype=np.float64)
    if log_decay < 0.0:
        for a in range(ages):
            decay[a] = np.exp(log_decay * a)
    for i in range(batch_slots.shape[0]):
        s = batch_slots[i]
        if log_decay < 0.0:
            age = now - last[s]
            f = decay[age] if 0 <= age < ages else np.exp(log_decay * age)
            counts[s] = np.float32(counts[s] * f + 1.0)
        else:
            counts[s] += np.float32(1.0)
        last[s] = now
        if train_dirty:
            dirty[s] = True
