"""Numba kernels of the capacity planner: trace preparation and the batch-granular cache simulator.

They take arrays, never objects, and are compiled with ``cache=True``, ``nogil=True`` (so several
simulations can run on threads) and without fastmath. The semantics are documented in
``cosparse.tune.cache_sim``; this module only implements them.

Every policy is one *priority*: a float key per row, kept for all IDs across evictions, where the
victim is the unpinned resident row with the smallest ``(key, id)``. Resident rows sit in a lazy
binary min-heap: a changed key pushes a new entry, and stale entries (row evicted, or key changed
since) are dropped when popped. The heap is rebuilt from the resident rows when it holds more than
four times the capacity, so every operation is O(log C) amortized.
"""

from __future__ import annotations

import numba
import numpy as np

LRU = 0  # key: batch of last use (never used: -1)
LFU = 1  # key: number of batches the row appeared in
HOTNESS = 2  # key: log of the decayed frequency, shifted so keys of different ages compare
BELADY = 3  # key: -(batch of next use); never used again: -(num_batches)
STATIC = 4  # key: given per row (the popularity oracle: total count over the whole trace)

# stats returned by simulate_cache, in this order
STAT_NAMES = ("hits", "lookups", "hits_warm", "lookups_warm", "fetches", "evictions", "shrinks")


# --- trace preparation ------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True)
def next_use(ids, offsets, num_ids):
    """Backward pass: ``nxt[j]`` = batch of the next use of ``ids[j]`` after its batch, and
    ``first[i]`` = batch of the first use of row ``i``; ``num_batches`` stands for never."""
    nb = offsets.shape[0] - 1
    nxt = np.empty(ids.shape[0], dtype=np.int64)
    last = np.full(num_ids, nb, dtype=np.int64)
    for t in range(nb - 1, -1, -1):
        for j in range(offsets[t], offsets[t + 1]):
            i = ids[j]
            nxt[j] = last[i]
            last[i] = t
    return nxt, last


@numba.njit(cache=True, nogil=True)
def window_sizes(ids, offsets, num_ids, k):
    """``ws[t, d]`` = distinct rows of batches ``t..t+d`` (clipped at the end of the trace)."""
    nb = offsets.shape[0] - 1
    ws = np.zeros((nb, k + 1), dtype=np.int64)
    mark = np.full(num_ids, -1, dtype=np.int64)
    for t in range(nb):
        cnt = 0
        for d in range(k + 1):
            s = t + d
            if s < nb:
                for j in range(offsets[s], offsets[s + 1]):
                    i = ids[j]
                    if mark[i] != t:
                        mark[i] = t
                        cnt += 1
            ws[t, d] = cnt
    return ws


# --- lazy min-heap on (key, id) ----------------------------------------------------------------
@numba.njit(inline="always")
def _less(ka, ia, kb, ib):
    return ka < kb or (ka == kb and ia < ib)


@numba.njit(cache=True, nogil=True)
def _push(hk, hi, n, key, i):
    pos = n
    while pos > 0:
        parent = (pos - 1) >> 1
        if _less(key, i, hk[parent], hi[parent]):
            hk[pos] = hk[parent]
            hi[pos] = hi[parent]
            pos = parent
        else:
            break
    hk[pos] = key
    hi[pos] = i
    return n + 1


@numba.njit(cache=True, nogil=True)
def _sift_down(hk, hi, n, pos):
    key = hk[pos]
    i = hi[pos]
    while True:
        c = 2 * pos + 1
        if c >= n:
            break
        if c + 1 < n and _less(hk[c + 1], hi[c + 1], hk[c], hi[c]):
            c += 1
        if _less(hk[c], hi[c], key, i):
            hk[pos] = hk[c]
            hi[pos] = hi[c]
            pos = c
        else:
            break
    hk[pos] = key
    hi[pos] = i


@numba.njit(cache=True, nogil=True)
def _rebuild(hk, hi, res, n_res, key):
    """Heap of the resident rows' current keys, built bottom-up in O(n); returns its size."""
    for s in range(n_res):
        hk[s] = key[res[s]]
        hi[s] = res[s]
    for pos in range(n_res // 2 - 1, -1, -1):
        _sift_down(hk, hi, n_res, pos)
    return n_res


@numba.njit(cache=True, nogil=True)
def _pop(hk, hi, n):
    """Remove the root (read ``hk[0], hi[0]`` first); returns the new size."""
    n -= 1
    key = hk[n]
    i = hi[n]
    pos = 0
    while True:
        c = 2 * pos + 1
        if c >= n:
            break
        if c + 1 < n and _less(hk[c + 1], hi[c + 1], hk[c], hi[c]):
            c += 1
        if _less(hk[c], hi[c], key, i):
            hk[pos] = hk[c]
            hi[pos] = hi[c]
            pos = c
        else:
            break
    if n > 0:
        hk[pos] = key
        hi[pos] = i
    return n


# --- the simulator ---------------------------------------------------------------------------------
# ``simulate_cache`` runs one batch at a time: ``_record_batch`` (hits, then the policy keys),
# ``_window_end`` (how far ahead the window fits), ``_fill_window`` (demand misses and prefetches,
# with their evictions). The helpers return the scalar state they change, so the operations run
# in the same order as in one loop. The victim search stays inside ``_fill_window``: it runs once
# per eviction, and a call there (inlined or not) measurably slowed the simulation.
@numba.njit(cache=True, nogil=True)
def _initial_keys(num_ids, policy, first, static_key):
    """Every row's key before the first batch."""
    key = np.empty(num_ids, dtype=np.float64)
    for i in range(num_ids):
        if policy == LRU:
            key[i] = -1.0
        elif policy == LFU:
            key[i] = 0.0
        elif policy == HOTNESS:
            key[i] = -np.inf
        elif policy == BELADY:
            key[i] = -float(first[i])
        else:
            key[i] = static_key[i]
    return key


@numba.njit(cache=True, nogil=True)
def _heap_capacity(offsets, capacity, k):
    """Room for the lazy heap: 4 capacities (rebuilt above that) plus two windows of lookups."""
    nb = offsets.shape[0] - 1
    maxw = 0  # most lookups in k + 1 consecutive batches
    for t in range(nb):
        w = offsets[min(t + k + 1, nb)] - offsets[t]
        if w > maxw:
            maxw = w
    return 4 * capacity + 2 * maxw + 16


@numba.njit(cache=True, nogil=True)
def _record_batch(t, lo, hi_, ids, nxt, policy, decay, logd, resident, key, cur_next, used_at, hs,
                  hlast, hk, hi, hn):
    """Count batch ``t``'s hits against the cache as it stands, then update each row's history
    and key (a resident row's new key is pushed). Returns (hits, heap size)."""
    h = 0
    for j in range(lo, hi_):
        i = ids[j]
        if resident[i]:
            h += 1
        used_at[i] = t
        cur_next[i] = nxt[j]
        if policy == LRU:
            key[i] = float(t)
        elif policy == LFU:
            key[i] += 1.0
        elif policy == HOTNESS:
            sc = 1.0
            if hs[i] > 0.0:
                sc = hs[i] * decay ** (t - hlast[i]) + 1.0
            hs[i] = sc
            hlast[i] = t
            key[i] = np.log(sc) - t * logd
        elif policy == BELADY:
            key[i] = -float(nxt[j])
        if resident[i] and policy != STATIC:
            hn = _push(hk, hi, hn, key[i], i)
    return h, hn


@numba.njit(inline="always")
def _window_end(ws, t, nb, k, capacity):
    """(kp, shrunk): batches ``t..t+kp`` fit in ``capacity`` together, ``kp <= k``; ``shrunk``
    when the end of the trace did not set ``kp``."""
    kmax = min(k, nb - 1 - t)
    kp = kmax
    while kp > 0 and ws[t, kp] > capacity:
        kp -= 1
    return kp, kp < kmax


@numba.njit(cache=True, nogil=True)
def _farthest_queued(q, nq, qpos, q_sorted, cur_next, qn_buf):
    """The next row of ``q`` by farthest next use (sorted on first use; q is in (key, id) order
    already, and a stable sort keeps that for ties). Returns (row, qpos, q_sorted)."""
    if not q_sorted:
        for s in range(nq):
            qn_buf[s] = -cur_next[q[s]]
        order = np.argsort(qn_buf[:nq], kind="mergesort")
        q[:nq] = q[:nq][order]
        q_sorted = True
    if qpos >= nq:
        raise RuntimeError("cache simulator: no victim (window larger than capacity)")
    return q[qpos], qpos + 1, q_sorted


@numba.njit(cache=True, nogil=True)
def _fill_window(t, lo, end, limit, known, capacity, ids, resident, key, used_at, cur_next, res,
                 slot_of, n_res, hk, hi, hn, side, q, qn_buf, stats):
    """Make rows ``ids[lo:end]`` resident (the demand misses of batch ``t``, then the prefetches
    of the window). When the cache is full, the victim is the first row popped from the heap
    that no batch up to ``known`` needs (rows of the pinned window, up to ``limit``, go aside;
    rows needed later in the full window are queued), else the queued row used farthest ahead.
    Then the popped rows that stay resident are pushed back. Returns (resident rows, heap size).
    """
    n_side = 0
    nq = 0
    qpos = 0
    q_sorted = False
    exhausted = False
    for j in range(lo, end):
        i = ids[j]
        if resident[i]:
            continue
        if n_res == capacity:
            v = -1
            while not exhausted:
                if hn == 0:
                    exhausted = True
                    break
                ck = hk[0]
                ci = hi[0]
                hn = _pop(hk, hi, hn)
                if not resident[ci] or key[ci] != ck:
                    continue  # stale entry
                if used_at[ci] == t or cur_next[ci] <= limit:
                    side[n_side] = ci
                    n_side += 1
                    continue
                if cur_next[ci] <= known:
                    q[nq] = ci
                    nq += 1
                    continue
                v = ci
                break
            if v < 0:  # only rows needed inside the full window are left: farthest next use first
                v, qpos, q_sorted = _farthest_queued(q, nq, qpos, q_sorted, cur_next, qn_buf)
            # evict v
            resident[v] = False
            s = slot_of[v]
            last = res[n_res - 1]
            res[s] = last
            slot_of[last] = s
            slot_of[v] = -1
            n_res -= 1
            stats[5] += 1
        resident[i] = True
        res[n_res] = i
        slot_of[i] = n_res
        n_res += 1
        hn = _push(hk, hi, hn, key[i], i)
        stats[4] += 1
    for s in range(n_side):
        i = side[s]
        if resident[i]:
            hn = _push(hk, hi, hn, key[i], i)
    for s in range(qpos, nq):
        i = q[s]
        if resident[i]:
            hn = _push(hk, hi, hn, key[i], i)
    return n_res, hn


@numba.njit(cache=True, nogil=True)
def simulate_cache(ids, offsets, nxt, first, ws, num_ids, capacity, policy, k, decay, static_key,
                   warm_start):
    """Simulate one cache of ``capacity`` rows; returns int64 stats in ``STAT_NAMES`` order.

    ``ws`` comes from ``window_sizes(.., k)``; ``static_key`` is only read by ``STATIC``. The caller
    checks feasibility (``capacity >= max |U_t|``).
    """
    nb = offsets.shape[0] - 1
    stats = np.zeros(7, dtype=np.int64)
    resident = np.zeros(num_ids, dtype=np.bool_)
    key = _initial_keys(num_ids, policy, first, static_key)
    cur_next = first.copy()
    hs = np.zeros(num_ids, dtype=np.float64)  # hotness at the last use
    hlast = np.zeros(num_ids, dtype=np.int64)
    used_at = np.full(num_ids, -1, dtype=np.int64)
    logd = np.log(decay)

    res = np.empty(max(capacity, 1), dtype=np.int64)  # resident rows, compact
    slot_of = np.full(num_ids, -1, dtype=np.int64)
    n_res = 0

    hcap = _heap_capacity(offsets, capacity, k)
    hk = np.empty(hcap, dtype=np.float64)
    hi = np.empty(hcap, dtype=np.int64)
    hn = 0
    side = np.empty(hcap, dtype=np.int64)  # popped pinned rows, pushed back after the step
    q = np.empty(hcap, dtype=np.int64)  # popped rows needed later in the full (unshrunk) window
    qn_buf = np.empty(hcap, dtype=np.int64)

    for t in range(nb):
        if hn > 4 * capacity:  # drop the stale entries
            hn = _rebuild(hk, hi, res, n_res, key)
        lo = offsets[t]
        hi_ = offsets[t + 1]
        # 1. count hits against the cache as it stands at the start of the batch; update history
        h, hn = _record_batch(t, lo, hi_, ids, nxt, policy, decay, logd, resident, key, cur_next,
                              used_at, hs, hlast, hk, hi, hn)
        stats[0] += h
        stats[1] += hi_ - lo
        if t >= warm_start:
            stats[2] += h
            stats[3] += hi_ - lo
        # 2. the window: batches t..t+kp must fit together, kp <= k
        kp, shrunk = _window_end(ws, t, nb, k, capacity)
        if shrunk:
            stats[6] += 1
        limit = t + kp  # pinned: used in this batch or needed by batch <= limit
        known = t + k  # next use known (inside the full window) but not pinned after a shrink
        # 3. make the window resident: demand misses of batch t, then prefetches of t+1..t+kp
        n_res, hn = _fill_window(t, lo, offsets[t + kp + 1], limit, known, capacity, ids,
                                 resident, key, used_at, cur_next, res, slot_of, n_res, hk, hi, hn,
                                 side, q, qn_buf, stats)
    return stats
