"""Evaluation: the eval stream joined into large batches, and the metrics: ROC AUC (rank
statistic with tied ranks averaged) and log loss."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from cosparse.batch import SparseBatch, concat_batches


def joined_batches(stream: Iterable[SparseBatch], want: int) -> Iterator[SparseBatch]:
    """The stream's batches joined into at least ``want`` samples each: one dedup, one read of
    the rows (no planning, no pins) and one forward per joined batch."""
    group: list[SparseBatch] = []
    for batch in stream:
        group.append(batch)
        if sum(b.batch_size for b in group) >= want:
            yield concat_batches(group)
            group = []
    if group:
        yield concat_batches(group)


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve; NaN (undefined) when only one class is present, or when a
    score is NaN (a model whose weights are no longer finite ranks nothing)."""
    labels = np.asarray(labels, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    pos = labels > 0.5
    n_pos = int(pos.sum())
    n_neg = labels.shape[0] - n_pos
    if n_pos == 0 or n_neg == 0 or np.isnan(scores).any():
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    # average rank (1-based) of each group of tied scores
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_scores)) + 1]
    ends = np.r_[starts[1:], sorted_scores.shape[0]]
    group_rank = (starts + ends + 1) / 2.0
    ranks = np.empty_like(sorted_scores)
    ranks[order] = np.repeat(group_rank, ends - starts)
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def log_loss(labels: np.ndarray, probs: np.ndarray, eps: float = 1e-7) -> float:
    p = np.clip(np.asarray(probs, dtype=np.float64), eps, 1 - eps)
    y = np.asarray(labels, dtype=np.float64)
    return float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean())
