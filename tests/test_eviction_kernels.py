"""``select_victims`` against a plain numpy reference: the n unpinned occupied slots with the
lowest (policy score, slot), rows the horizon needs only when the others run out."""

from __future__ import annotations

import numpy as np
import pytest

from cosparse.store import kernels


def _reference(policy: int, occupied: np.ndarray, pins: np.ndarray, counts: np.ndarray,
               last: np.ndarray, now: int, log_decay: float, n: int, wanted: np.ndarray,
               floor: int) -> np.ndarray:
    if policy == kernels.POLICY_LRU:
        score = last.astype(np.float64)
    elif policy == kernels.POLICY_LFU:
        score = counts.astype(np.float64)
    else:
        score = np.log(counts.astype(np.float64) + 1e-30) + log_decay * (now - last)
    free = occupied & (pins == 0)
    out = []
    for group in (free & (wanted <= floor), free & (wanted > floor)):
        slots = np.flatnonzero(group)
        order = np.lexsort((slots, score[slots]))  # by score, then slot
        out.extend(slots[order][: n - len(out)].tolist())
    return np.array(out, dtype=np.int64)


@pytest.mark.parametrize("policy", [kernels.POLICY_LRU, kernels.POLICY_LFU, kernels.POLICY_HOTNESS])
@pytest.mark.parametrize("n", [0, 1, 37, 400, 3000])
def test_select_victims_is_the_exact_lowest_scores(policy: int, n: int) -> None:
    rng = np.random.default_rng(policy * 100 + n)
    cap = 2000
    occupied = rng.random(cap) < 0.9
    pins = (rng.random(cap) < 0.3).astype(np.int32) * rng.integers(1, 4, cap).astype(np.int32)
    wanted = rng.integers(0, 6, cap).astype(np.int32)  # floor 3: about half are needed
    counts = rng.integers(1, 8, cap).astype(np.float32)  # ties in every policy
    last = rng.integers(0, 50, cap).astype(np.int64)
    out = np.full(max(n, 1), -7, dtype=np.int64)
    found = kernels.select_victims(policy, occupied, pins, counts, last, 60, float(np.log(0.9)),
                                   n, out, wanted, 3)
    expect = _reference(policy, occupied, pins, counts, last, 60, float(np.log(0.9)), n, wanted, 3)
    assert found == expect.shape[0] == min(n, int((occupied & (pins == 0)).sum()))
    assert np.array_equal(np.sort(out[:found]), np.sort(expect))
    assert n < 3000 or found < n  # more asked than evictable: all of them, and no more


def test_select_victims_takes_needed_rows_last_and_never_pinned_ones() -> None:
    cap = 10
    occupied = np.ones(cap, np.bool_)
    pins = np.zeros(cap, np.int32)
    pins[:3] = 1
    wanted = np.zeros(cap, np.int32)
    wanted[3:6] = 2
    counts = np.arange(cap, 0, -1).astype(np.float32)  # slot 0 coldest by count... but pinned
    last = np.zeros(cap, np.int64)
    out = np.empty(6, np.int64)
    found = kernels.select_victims(kernels.POLICY_LFU, occupied, pins, counts, last, 0, 0.0, 6,
                                   out, wanted, 0)
    # the 4 unneeded rows first (slots 6..9), then the coldest needed ones (5, 4)
    assert found == 6 and sorted(out[:4].tolist()) == [6, 7, 8, 9] and sorted(out[4:].tolist()) == [4, 5]


def test_select_victims_without_a_horizon_reads_no_wanted_array() -> None:
    """A tier without a horizon passes an empty ``wanted``: no row is needed, nothing is read."""
    rng = np.random.default_rng(9)
    cap = 500
    occupied = rng.random(cap) < 0.8
    pins = (rng.random(cap) < 0.2).astype(np.int32)
    counts = rng.integers(1, 9, cap).astype(np.float32)
    last = rng.integers(0, 30, cap).astype(np.int64)
    out = np.empty(120, np.int64)
    found = kernels.select_victims(kernels.POLICY_LFU, occupied, pins, counts, last, 30, 0.0, 120,
                                   out, np.zeros(0, np.int32), 0)
    expect = _reference(kernels.POLICY_LFU, occupied, pins, counts, last, 30, 0.0, 120,
                        np.zeros(cap, np.int32), 0)
    assert found == 120 and np.array_equal(np.sort(out), np.sort(expect))
