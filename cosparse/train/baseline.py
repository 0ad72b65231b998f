"""Honest baselines for a model's eval AUC, on the same readers (so the same features and the
same split): logistic regression over the hashed IDs and the dense columns, item popularity for
recommendation samples, and the AUC's standard error (Hanley and McNeil, 1982) to compare two
AUCs by.

The regression is one weight per hashed ID (IDs modulo ``buckets``, summed per sample), a
linear term of the dense columns and a bias, trained with Adagrad.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from cosparse.batch import SparseBatch
from cosparse.data.reader import Reader
from cosparse.train.evaluate import roc_auc


@dataclass(frozen=True)
class BaselineResult:
    auc: float
    auc_se: float
    eval_samples: int


def auc_standard_error(auc: float, positives: int, negatives: int) -> float:
    """Hanley and McNeil's standard error of an AUC over ``positives`` and ``negatives``."""
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    var = (auc * (1 - auc) + (positives - 1) * (q1 - auc * auc)
           + (negatives - 1) * (q2 - auc * auc)) / (positives * negatives)
    return math.sqrt(max(var, 0.0))


class _Logistic(nn.Module):
    def __init__(self, buckets: int, num_dense: int) -> None:
        super().__init__()
        self.buckets = buckets
        self.ids = nn.Embedding(buckets, 1)
        nn.init.zeros_(self.ids.weight)
        self.bias = nn.Parameter(torch.zeros(1))
        self.dense = nn.Linear(num_dense, 1, bias=False) if num_dense else None

    def forward(self, b: SparseBatch) -> torch.Tensor:
        n = b.batch_size
        # lengths are feature-major: entry f * n + i is sample i's bag of feature f
        sample_of = torch.arange(n).repeat(len(b.keys)).repeat_interleave(b.lengths)
        weights = self.ids(torch.remainder(b.values, self.buckets)).squeeze(1)
        logit = torch.zeros(n).index_add(0, sample_of, weights) + self.bias
        if self.dense is not None:
            logit = logit + self.dense(b.dense).squeeze(1)
        return logit


def _batches(reader: Reader) -> list[SparseBatch]:
    return [reader.build(t) for t in reader.tasks()]


def logistic_regression(train: Reader, eval_: Reader, epochs: int = 3, lr: float = 0.1,
                        buckets: int = 1 << 20, seed: int = 0) -> BaselineResult:
    """Train on every batch of ``train`` ``epochs`` times, score ``eval_``."""
    torch.manual_seed(seed)
    train_batches = _batches(train)
    model = _Logistic(buckets, train.num_dense)
    opt = torch.optim.Adagrad(model.parameters(), lr=lr)
    loss_fn = nn.BCEWithLogitsLoss()
    for _ in range(epochs):
        for b in train_batches:
            opt.zero_grad()
            loss_fn(model(b), b.labels).backward()
            opt.step()
    labels, scores = [], []
    with torch.no_grad():
        for b in _batches(eval_):
            labels.append(b.labels.numpy())
            scores.append(model(b).numpy())
    y, s = np.concatenate(labels), np.concatenate(scores)
    auc = roc_auc(y, s)
    pos = int((y > 0.5).sum())
    return BaselineResult(auc, auc_standard_error(auc, pos, len(y) - pos), len(y))


def popularity(train: Reader, eval_: Reader, item_key: str = "item") -> BaselineResult:
    """Score each eval sample by how often its item is a positive among the training
    samples (the item-popularity baseline of recommendation)."""
    pos_items = []
    for b in _batches(train):
        items, _ = b.feature(item_key)
        pos_items.append(items.numpy()[b.labels.numpy() > 0.5])
    vocab, counts = np.unique(np.concatenate(pos_items), return_counts=True)
    labels, scores = [], []
    for b in _batches(eval_):
        items = b.feature(item_key)[0].numpy()
        at = np.minimum(np.searchsorted(vocab, items), len(vocab) - 1)
        scores.append(np.where(vocab[at] == items, counts[at], 0).astype(np.float64))
        labels.append(b.labels.numpy())
    y, s = np.concatenate(labels), np.concatenate(scores)
    auc = roc_auc(y, s)
    pos = int((y > 0.5).sum())
    return BaselineResult(auc, auc_standard_error(auc, pos, len(y) - pos), len(y))


def auto_kind(train: Reader, sampled_negatives: bool) -> tuple[str, str]:
    """(the baseline ``--kind auto`` picks, why), from the labels: implicit feedback (negatives
    sampled by ``data.negatives``, or every label of the file 1) is scored by item popularity,
    explicit 0/1 labels by logistic regression (as is anything without an ``item`` feature)."""
    if "item" not in train.keys:
        return "logistic", "no 'item' feature"
    if sampled_negatives:
        return "popularity", "implicit feedback: data.negatives samples the negatives"
    log = getattr(train, "log", None)  # reader interactions: the labels of the file's events
    if log is not None:
        labels = log.label
    else:
        labels = np.concatenate([b.labels.numpy() for b in _batches(train)] or [np.ones(0)])
    if labels is None or bool((labels > 0.5).all()):
        return "popularity", "implicit feedback: every label in the file is 1"
    return "logistic", "explicit 0/1 labels (clicked and not clicked)"
