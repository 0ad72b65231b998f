"""Criteo-style parsed columns -> SparseBatch: the dense transform and the one-ID bags.

Dense: a missing value gives 0, a present one ``log(1 + max(x, 0))`` as float32.
Categorical: a missing value gives an empty bag, a present one a bag of its single int64 ID.
"""

from __future__ import annotations

import numpy as np
import torch

from cosparse.batch import SparseBatch

NUM_DENSE = 13
NUM_SPARSE = 26
CRITEO_KEYS: list[str] = [f"C{i + 1}" for i in range(NUM_SPARSE)]
CRITEO_DENSE: list[str] = [f"I{i + 1}" for i in range(NUM_DENSE)]


def dense_transform(ints: np.ndarray, present: np.ndarray) -> np.ndarray:
    """int64 [n, d] values and bool presence -> float32 log1p(max(x, 0)), 0 where missing."""
    x = np.maximum(ints, 0).astype(np.float64)
    out = np.log1p(x).astype(np.float32)
    out[~present] = 0.0
    return out


def columns_to_batch(
    keys: list[str],
    labels: np.ndarray,
    ints: np.ndarray,
    int_present: np.ndarray,
    cats: np.ndarray,
    cat_present: np.ndarray,
    keep: np.ndarray | None = None,
    bad_records: int = 0,
    index: int = 0,
) -> SparseBatch:
    """Build a SparseBatch from row-major parsed columns, keeping the rows where ``keep`` is set."""
    if keep is not None and not keep.all():
        labels, ints, int_present = labels[keep], ints[keep], int_present[keep]
        cats, cat_present = cats[keep], cat_present[keep]
    pres_t = np.ascontiguousarray(cat_present.T)  # [F, B], feature-major
    lengths = pres_t.reshape(-1).astype(np.int64)
    values = np.ascontiguousarray(cats.T)[pres_t].astype(np.int64, copy=False)
    dense = dense_transform(ints, int_present)
    return SparseBatch(
        list(keys),
        torch.from_numpy(np.ascontiguousarray(values)),
        torch.from_numpy(lengths),
        torch.from_numpy(np.ascontiguousarray(dense)),
        torch.from_numpy(np.ascontiguousarray(labels, dtype=np.float32)),
        bad_records=int(bad_records),
        index=int(index),
    )
