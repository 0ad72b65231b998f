"""Tier metadata kernels: access statistics (counts, last access), pins, and the choice of
victims under the LRU, LFU or hotness policy."""

from __future__ import annotations

import numba
import numpy as np

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
def _nth_lowest(score, n):
    """The n-th lowest (0-based) of ``score``: a strided sample sets a bound a few standard
    errors above the n-th quantile, and the partial sort runs on the scores under it (about n
    of them); on the rare miss (fewer than n + 1 under it), on all of them. Exact either way."""
    m = score.shape[0]
    ns = min(m, 1024)
    stride = m // ns
    sample = np.empty(ns, dtype=np.float64)
    for i in range(ns):
        sample[i] = score[i * stride]
    sample.sort()
    q = (n + 1) / m
    at = int((q + 3.0 * np.sqrt(q * (1.0 - q) / ns) + 2.0 / ns) * ns)
    if at < ns:
        bound = sample[at]
        k = 0
        for i in range(m):
            k += score[i] <= bound
        if k > n:
            sub = np.empty(k, dtype=np.float64)
            k = 0
            for i in range(m):
                if score[i] <= bound:
                    sub[k] = score[i]
                    k += 1
            return np.partition(sub, n)[n]
    return np.partition(score.copy(), n)[n]


@numba.njit(cache=True, nogil=True)
def _lowest(cand, score, n, out, at):
    """Write the ``n`` candidates with the lowest (score, slot) to ``out[at:]`` (``cand`` is in
    slot order): the n-th lowest score, then one pass in slot order. Returns how many were
    written (fewer when there are fewer than ``n`` candidates)."""
    m = cand.shape[0]
    if n >= m:
        out[at : at + m] = cand
        return m
    v = _nth_lowest(score, n - 1)
    k = at
    for i in range(m):
        if score[i] < v:
            out[k] = cand[i]
            k += 1
    for i in range(m):  # ties at the n-th score: the lowest slots
        if k - at >= n:
            break
        if score[i] == v:
            out[k] = cand[i]
            k += 1
    return n


@numba.njit(cache=True, nogil=True)
def select_victims(policy, occupied, pins, counts, last, now, log_decay, n, out, wanted, floor):
    """Write to ``out`` the ``n`` unpinned occupied slots with the lowest (policy score, slot).

    Exact and deterministic: the evictable slots are gathered in one pass (a counting pass sizes
    the buffer), scored, and a partial sort (``np.partition``, on the scores under a sampled
    bound) finds the n-th lowest score: work linear in the tier's slots, with a score (a log,
    for hotness) only for the evictable ones. Rows that a batch in the horizon will need
    (``wanted[s] > floor``; ``wanted`` empty: none) are taken only when the others run out,
    again lowest score first. Returns the number found; fewer than ``n`` means too many slots
    are pinned. This replaces a sampled-threshold CLOCK sweep that scored every unpinned slot
    and kept approximately the lowest: the exact choice evicts no hotter row.

    Hand-written (numba): a numpy version needs several boolean masks and fancy-index copies
    of the tier's arrays per call, on the planner thread, for every batch and table.
    """
    cap = occupied.shape[0]
    found = 0
    if n <= 0:
        return 0
    horizon = wanted.shape[0] > 0  # empty: a tier without a horizon, no row is needed
    # round 0: rows no batch in the horizon needs; round 1: the needed ones (a preference only).
    # The passes over the slots are branch-free: the flags are random, mispredictions dominate.
    for rnd in range(2):
        need = rnd == 1
        m = 0
        for s in range(cap):
            m += occupied[s] & (pins[s] == 0) & ((horizon and wanted[s] > floor) == need)
        cand = np.empty(m + 1, dtype=np.int64)
        m = 0
        for s in range(cap):
            cand[m] = s
            m += occupied[s] & (pins[s] == 0) & ((horizon and wanted[s] > floor) == need)
        cand = cand[:m]
        score = np.empty(m, dtype=np.float64)
        for i in range(m):
            s = cand[i]
            score[i] = _score(policy, counts[s], last[s], now, log_decay)
        found += _lowest(cand, score, n - found, out, found)
        if found >= n:
            break
    return found


@numba.njit(cache=True, nogil=True)
def add_pins(slots, pins, delta):
    for i in range(slots.shape[0]):
        pins[slots[i]] += delta
