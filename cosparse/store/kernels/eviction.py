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
