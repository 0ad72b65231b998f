"""Train/eval split of a finite sequence of records: the first (1 - eval_fraction) are train."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

Split = Literal["train", "eval"]


def split_range(total: int, eval_fraction: float, split: Split) -> tuple[int, int]:
    """(first record, 0-based; record count) of ``split`` among ``total`` records.

    Train is the first ``round(total * (1 - eval_fraction))`` records, eval the rest.
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
    n_train = min(total, max(0, int(round(total * (1.0 - eval_fraction)))))
    if split == "train":
        return 0, n_train
    return n_train, total - n_train


def num_batches(count: int, batch_size: int) -> int:
    """Batches of ``batch_size`` needed for ``count`` records (the last may be partial)."""
    return -(-count // batch_size)


def row_batches(num_rows: int, batch_size: int, start_batch: int = 0
                ) -> Iterator[tuple[int, int, int]]:
    """(first row within the split, rows, batch index) of each batch from ``start_batch`` on."""
    if start_batch < 0:
        raise ValueError("start_batch must be >= 0")
    for i in range(start_batch, num_batches(num_rows, batch_size)):
        lo = i * batch_size
        yield lo, min(batch_size, num_rows - lo), i
