"""``data.shuffle``: a seeded, resumable shuffle of a split's training rows.

The rows are cut into windows of ``buffer`` rows rounded up to whole batches; each window's rows
are permuted by a generator seeded with ``[seed, window]``. Every row stays within its window (as
with a shuffle buffer, rows travel at most a buffer's length, across row groups and files), the
order is a pure function of (rows, buffer, batch size, seed), and batch ``i`` is found without
replaying the batches before it, so resume and every placement see the same batches.

Written here rather than taken from a library: the shuffle buffers of torch's and TF's input
pipelines are stateful streams that cannot restart at a batch.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from cosparse.config import ShuffleConfig


def window_batches(buffer: int, batch_size: int) -> int:
    """Batches per shuffle window: the buffer rounded up to whole batches (at least one)."""
    return max(1, -(-buffer // batch_size))


def window_permutation(size: int, seed: int, window: int) -> np.ndarray:
    """The order of one window's ``size`` rows (positions within the window)."""
    return np.random.default_rng([seed, window]).permutation(size).astype(np.int64)


def shuffled(rows: np.ndarray, window_rows: int, seed: int) -> np.ndarray:
    """``rows`` permuted within consecutive windows of ``window_rows``."""
    out = np.empty_like(rows)
    for w, lo in enumerate(range(0, len(rows), window_rows)):
        part = rows[lo:lo + window_rows]
        out[lo:lo + len(part)] = part[window_permutation(len(part), seed, w)]
    return out


def shuffled_batches(row_start: int, num_rows: int, batch_size: int, shuffle: ShuffleConfig,
                     start_batch: int = 0) -> Iterator[tuple[int, np.ndarray]]:
    """(batch index, its rows in order) of the rows ``row_start ..`` shuffled, from batch
    ``start_batch`` on; only the windows from ``start_batch``'s are permuted."""
    per = window_batches(shuffle.buffer, batch_size)
    rows = per * batch_size
    for w in range(start_batch // per, -(-num_rows // rows)):
        lo = w * rows
        n = min(rows, num_rows - lo)
        order = row_start + lo + window_permutation(n, shuffle.seed, w)
        for j in range(max(0, start_batch - w * per), -(-n // batch_size)):
            yield w * per + j, order[j * batch_size:(j + 1) * batch_size]
