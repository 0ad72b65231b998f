"""A table's vocabulary growth: its distinct row keys after each of the probe batches, and the
distinct rows a run of more steps will hold, extrapolated by Heaps' law (distinct rows grow as
a power of the batches seen) and bounded by the table's configured capacity."""

from __future__ import annotations

import numpy as np


def distinct_curve(keys_per_batch: list[np.ndarray]) -> np.ndarray:
    """Distinct keys seen after each batch (cumulative), from every key's first batch."""
    if not keys_per_batch:
        return np.zeros(0, dtype=np.int64)
    keys = np.concatenate(keys_per_batch)
    batch_of = np.repeat(np.arange(len(keys_per_batch)), [k.shape[0] for k in keys_per_batch])
    _, first = np.unique(keys, return_index=True)  # the first occurrence: the earliest batch
    return np.cumsum(np.bincount(batch_of[first], minlength=len(keys_per_batch)))


def growth_exponent(curve: np.ndarray) -> float:
    """The power b of distinct(k) ~ a k^b, fitted in log-log over the later half of the curve
    (its recent slope: a Zipf vocabulary's slope only falls, so extrapolating it errs high);
    1 (linear) with under 2 batches, clipped to [0, 1]."""
    k = np.arange(1, curve.shape[0] + 1)
    tail = slice(curve.shape[0] // 2, None)
    if curve.shape[0] < 2 or curve[0] <= 0:
        return 1.0
    b = np.polyfit(np.log(k[tail]), np.log(curve[tail]), 1)[0]
    return float(np.clip(b, 0.0, 1.0))


def predicted_rows(curve: np.ndarray, steps: int | None, capacity: int | None) -> int:
    """Distinct rows after ``steps`` batches (None: the probe's own), extrapolated from
    ``curve``, at most ``capacity`` rows (None: unbounded)."""
    seen = int(curve[-1]) if curve.shape[0] else 0
    if steps is None or steps <= curve.shape[0] or seen == 0:
        rows = int(curve[steps - 1]) if steps and 0 < steps <= curve.shape[0] else seen
    else:
        rows = int(np.ceil(seen * (steps / curve.shape[0]) ** growth_exponent(curve)))
    return rows if capacity is None else min(rows, capacity)
