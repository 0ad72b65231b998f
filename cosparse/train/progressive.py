"""Progressive validation of a stream (``data.stream``): each batch is scored by the model as it
is before training on that batch (the training forward's own predictions, taken before the
update; with model dropout, the dropped-out forward's), and the evaluation is the AUC and log
loss of the most recent ``eval_window_rows`` of those scores. Every sample is scored once,
unseen, without a held-out split and without an extra forward."""

from __future__ import annotations

from collections import deque

import numpy as np

from cosparse.train.evaluate import log_loss, roc_auc


class ProgressiveWindow:
    """The labels and pre-update scores of the last ``rows`` samples trained."""

    def __init__(self, rows: int) -> None:
        if rows < 1:
            raise ValueError("rows must be >= 1")
        self.capacity = rows
        self.rows = 0  # held now
        self.scored = 0  # ever added
        self._parts: deque[tuple[np.ndarray, np.ndarray]] = deque()

    def add(self, labels: np.ndarray, scores: np.ndarray) -> None:
        """One batch's labels and scores (the oldest rows beyond the window are dropped)."""
        labels = np.asarray(labels, np.float32).reshape(-1)
        scores = np.asarray(scores, np.float32).reshape(-1)
        if labels.shape != scores.shape:
            raise ValueError(f"labels {labels.shape} and scores {scores.shape} differ")
        self._parts.append((labels, scores))
        self.rows += labels.shape[0]
        self.scored += labels.shape[0]
        while self.rows > self.capacity:
            y, p = self._parts[0]
            extra = self.rows - self.capacity
            if extra >= y.shape[0]:
                self._parts.popleft()
                self.rows -= y.shape[0]
            else:
                self._parts[0] = (y[extra:], p[extra:])
                self.rows -= extra

    def scores(self) -> dict[str, float]:
        """AUC, log loss and the samples of the window ({} when empty)."""
        if not self.rows:
            return {}
        y = np.concatenate([y for y, _ in self._parts])
        p = np.concatenate([p for _, p in self._parts])
        return {"auc": roc_auc(y, p), "logloss": log_loss(y, p), "eval_samples": int(y.shape[0])}
