"""Numba kernels for host-side ID work: hashing, the ID->slot map, dedup, the transposed bag index,
row gathers and deterministic row initialisation. They take arrays, never objects.

All kernels are compiled with ``cache=True`` and without fastmath; the row-parallel ones use
``prange`` and never reduce across rows, so results do not depend on the thread count.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_EMPTY = np.int32(-1)


@numba.njit(inline="always")
def mix64(x: np.uint64) -> np.uint64:
    """SplitMix64 finaliser: a bijective 64-bit mix."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


@numba.njit(inline="always")
def _bucket(key: np.int64, mask: np.uint64) -> np.int64:
    return np.int64(mix64(np.uint64(key)) & mask)


# --- ID -> slot map: open addressing, linear probing ----------------------------------------
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
        b = _bucket(k, mask)
        while True:
            v = vals[b]
            if v == _EMPTY:
                if next_slot >= limit:
                    return -1
                keys[b] = k
                vals[b] = next_slot
                out_slots[i] = next_slot
                next_slot += 1
                break
            if keys[b] == k:
                out_slots[i] = v
                break
            b = (b + 1) & np.int64(mask)
    return next_slot


@numba.njit(cache=True, nogil=True)
def map_lookup(keys, vals, ids, out_slots):
    """Slot of each id, or -1 when absent. Returns the number found."""
    mask = np.uint64(keys.shape[0] - 1)
    found = 0
    for i in range(ids.shape[0]):
        k = ids[i]
        b = _bucket(k, mask)
        out_slots[i] = -1
        while True:
            v = vals[b]
            if v == _EMPTY:
                break
            if keys[b] == k:
                out_slots[i] = v
                found += 1
                break
            b = (b + 1) & np.int64(mask)
    return found


@numba.njit(cache=True, nogil=True)
def map_rehash(old_keys, old_vals, new_keys, new_vals):
    mask = np.uint64(new_keys.shape[0] - 1)
    for i in range(old_keys.shape[0]):
        v = old_vals[i]
        if v == _EMPTY:
            continue
        k = old_keys[i]
        b = _bucket(k, mask)
        while new_vals[b] != _EMPTY:
            b = (b + 1) & np.int64(mask)
        new_keys[b] = k
        new_vals[b] = v


# --- per-batch dedup with reused scratch ------------------------------------------------------
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
        b = _bucket(k, mask)
        while True:
            v = scratch_vals[b]
            if v == _EMPTY:
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
        scratch_vals[used[u]] = _EMPTY
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


# --- rows ---------------------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True, parallel=True)
def gather_rows(slab, slots, dim, out_w, out_s):
    """out_w[u] = slab[slots[u], :dim]; out_s[u] = slab[slots[u], dim:] (one pass over each row).

    A negative slot reads zeros (an ID not yet admitted).
    """
    width = slab.shape[1]
    for u in prange(slots.shape[0]):
        s = slots[u]
        if s < 0:  # not admitted: the shared default (zero) row
            for c in range(dim):
                out_w[u, c] = 0.0
            for c in range(dim, width):
                out_s[u, c - dim] = 0.0
            continue
        for c in range(dim):
            out_w[u, c] = slab[s, c]
        for c in range(dim, width):
            out_s[u, c - dim] = slab[s, c]


def _init_rows(slab, slots, ids, seed, dim, kind, a, b, state_value):
    """Initialise rows ``slots`` for ``ids``: each value is a pure function of (seed, id, column).

    kind 0: uniform(a, b); kind 1: normal(0, a) by Box-Muller. Optimizer state <- state_value.
    """
    width = slab.shape[1]
    s64 = mix64(np.uint64(seed) * _GOLDEN + np.uint64(0x632BE59BD9B4E019))
    for i in prange(slots.shape[0]):
        base = mix64(s64 ^ np.uint64(ids[i]))
        r = slots[i]
        for c in range(dim):
            h1 = mix64(base + np.uint64(2 * c + 1) * _GOLDEN)
            u1 = np.float64(h1 >> np.uint64(11)) * (1.0 / 9007199254740992.0)
            if kind == 0:
                slab[r, c] = np.float32(a + (b - a) * u1)
            else:
                h2 = mix64(base + np.uint64(2 * c + 2) * _GOLDEN)
                u2 = np.float64(h2 >> np.uint64(11)) * (1.0 / 9007199254740992.0)
                z = np.sqrt(-2.0 * np.log(1.0 - u1)) * np.cos(2.0 * np.pi * u2)
                slab[r, c] = np.float32(a * z)
        for c in range(dim, width):
            slab[r, c] = state_value


init_rows = numba.njit(cache=True, nogil=True, parallel=True)(_init_rows)
init_rows_serial = numba.njit(cache=True, nogil=True)(_init_rows)  # for the planner's thread


@numba.njit(cache=True, nogil=True)
def map_insert(keys, vals, ids, slots):
    """Insert absent ids with the given slots (the caller guarantees absence and room)."""
    mask = np.uint64(keys.shape[0] - 1)
    for i in range(ids.shape[0]):
        k = ids[i]
        b = _bucket(k, mask)
        while vals[b] != _EMPTY:
            b = (b + 1) & np.int64(mask)
        keys[b] = k
        vals[b] = slots[i]


@numba.njit(inline="always")
def _erase_at(keys, vals, b, mask):
    """Empty bucket ``b`` by backward-shift deletion: later members of its probe run move back
    into the hole unless their home bucket lies cyclically in (hole, j]. No tombstones."""
    hole = b
    j = (b + 1) & np.int64(mask)
    while vals[j] != _EMPTY:
        home = _bucket(keys[j], mask)
        if ((j - home) & np.int64(mask)) >= ((j - hole) & np.int64(mask)):
            keys[hole] = keys[j]
            vals[hole] = vals[j]
            hole = j
        j = (j + 1) & np.int64(mask)
    vals[hole] = _EMPTY


@numba.njit(cache=True, nogil=True)
def map_erase(keys, vals, ids):
    """Erase ids (backward-shift deletion). Returns the number erased."""
    mask = np.uint64(keys.shape[0] - 1)
    erased = 0
    for i in range(ids.shape[0]):
        k = ids[i]
        b = _bucket(k, mask)
        while vals[b] != _EMPTY:
            if keys[b] == k:
                _erase_at(keys, vals, b, mask)
                erased += 1
                break
            b = (b + 1) & np.int64(mask)
    return erased


# --- future uses: how many batches beyond the pinned window will need an ID ---------------------
@numba.njit(cache=True, nogil=True)
def future_add(keys, vals, ids, delta):
    """vals[id] += delta for unique ``ids`` (inserting at +1, erasing at 0). Returns the change in
    the number of keys. ``vals`` holds -1 for empty buckets; the caller keeps load <= 0.7."""
    mask = np.uint64(keys.shape[0] - 1)
    change = 0
    for i in range(ids.shape[0]):
        k = ids[i]
        b = _bucket(k, mask)
        while True:
            v = vals[b]
            if v == _EMPTY:
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
                    _erase_at(keys, vals, b, mask)
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
        b = _bucket(k, mask)
        out[i] = 0
        while True:
            v = vals[b]
            if v == _EMPTY:
                break
            if keys[b] == k:
                out[i] = v
                break
            b = (b + 1) & np.int64(mask)


# --- tier metadata: hotness, recency, pins ------------------------------------------------------
POLICY_LRU = 0
POLICY_LFU = 1
POLICY_HOTNESS = 2


@numba.njit(cache=True, nogil=True)
def touch(slots, counts, last, now, log_decay):
    """Record an access at step ``now``: counts (decayed when log_decay < 0) and last access."""
    for i in range(slots.shape[0]):
        s = slots[i]
        if log_decay < 0.0:
            counts[s] = np.float32(counts[s] * np.exp(log_decay * (now - last[s])) + 1.0)
        else:
            counts[s] += np.float32(1.0)
        last[s] = now


@numba.njit(cache=True, nogil=True)
def _score(policy, count, last, now, log_decay):
    if policy == POLICY_LRU:
        return np.float64(last)
    if policy == POLICY_LFU:
        return np.float64(count)
    # hotness: log of the decayed count (monotone in the decayed count)
    return np.log(np.float64(count) + 1e-30) + log_decay * (now - last)


@numba.njit(cache=True, nogil=True)
def select_victims(policy, occupied, pins, counts, last, now, log_decay, hand, n, out, wanted):
    """Pick ``n`` unpinned occupied slots with the lowest policy score by a CLOCK-style sweep.

    A strided sample of scores sets a threshold; a sweep from ``hand`` collects up to 2n
    unpinned slots under it (a second sweep takes any unpinned slot if too few); the candidates
    are ordered by (score, sweep position) and the first ``n`` taken; the hand moves on to where
    the sweep stopped. Deterministic. Returns (victims found, new hand); fewer than ``n`` means
    too many slots are pinned. Rows that a batch in the horizon will need (``wanted`` > 0) are
    passed over, and taken only when nothing else is left.
    """
    cap = occupied.shape[0]
    if n <= 0 or cap == 0:
        return 0, hand
    # sample for the threshold
    n_sample = min(cap, 512)
    stride = max(1, cap // n_sample)
    sample = np.empty(n_sample, dtype=np.float64)
    ns = 0
    for i in range(n_sample):
        s = (hand + i * stride) % cap
        if occupied[s] and pins[s] == 0 and wanted[s] == 0:
            sample[ns] = _score(policy, counts[s], last[s], now, log_decay)
            ns += 1
    thr = np.inf
    if ns > 0:
        sample = np.sort(sample[:ns])
        # the quantile that holds about 2n of the evictable slots
        frac = min(1.0, 4.0 * n / (cap * ns / n_sample) + 8.0 / ns)
        thr = sample[min(ns - 1, int(frac * ns))]
    want = n + n // 4 + 16  # collect a little more than needed, then keep the lowest scores
    cand = np.empty(min(cap, want), dtype=np.int64)
    cscore = np.empty(min(cap, want), dtype=np.float64)
    nc = 0
    stop = hand
    # round 0: under the threshold and not needed by a batch in the horizon; round 1: any score,
    # still not needed; round 2: needed ones too (the horizon is only a preference, pins are not)
    for rnd in range(3):
        if rnd > 0:
            if nc >= n:
                break
            thr = np.inf
            nc = 0
        for i in range(cap):
            s = (hand + i) % cap
            stop = (s + 1) % cap
            if occupied[s] and pins[s] == 0:
                sc = _score(policy, counts[s], last[s], now, log_decay)
                if sc <= thr:
                    if rnd < 2 and wanted[s] > 0:
                        continue
                    cand[nc] = s
                    cscore[nc] = sc
                    nc += 1
                    if nc == cand.shape[0]:
                        break
    order = np.argsort(cscore[:nc], kind="mergesort")
    found = min(n, nc)
    for i in range(found):
        out[i] = cand[order[i]]
    return found, stop


@numba.njit(cache=True, nogil=True)
def add_pins(slots, pins, delta):
    for i in range(slots.shape[0]):
        pins[slots[i]] += delta


# --- admission: a count-min sketch with conservative update -----------------------------------
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
            b = np.int64(mix64(x + np.uint64(d + 1) * _GOLDEN) & mask)
            if sketch[d, b] < est:
                est = sketch[d, b]
        new = est + np.uint32(1) if est < np.uint32(0xFFFFFFFF) else est
        for d in range(depth):
            b = np.int64(mix64(x + np.uint64(d + 1) * _GOLDEN) & mask)
            if sketch[d, b] < new:
                sketch[d, b] = new
        ok = new >= min_count
        out_admitted[i] = ok
        if ok:
            n_admitted += 1
    return n_admitted


# The planner moves rows on its background thread while the trainer's torch ops use the cores:
# these copies are serial on purpose (a parallel region stalls when a core is busy).
@numba.njit(cache=True, nogil=True)
def take_rows(slab, slots, out):
    """out[i] = slab[slots[i]] (whole rows: values and optimizer state)."""
    width = slab.shape[1]
    for i in range(slots.shape[0]):
        s = slots[i]
        for c in range(width):
            out[i, c] = slab[s, c]


@numba.njit(cache=True, nogil=True)
def put_rows(slab, slots, rows):
    """slab[slots[i]] = rows[i] (slots are distinct)."""
    width = slab.shape[1]
    for i in range(slots.shape[0]):
        s = slots[i]
        for c in range(width):
            slab[s, c] = rows[i, c]


@numba.njit(cache=True, nogil=True)
def move_rows(src, src_slots, dst, dst_slots):
    """dst[dst_slots[i]] = src[src_slots[i]]: one copy between two tiers' slabs, no temporary."""
    width = src.shape[1]
    for i in range(src_slots.shape[0]):
        s = src_slots[i]
        d = dst_slots[i]
        for c in range(width):
            dst[d, c] = src[s, c]
