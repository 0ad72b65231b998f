"""Early stopping: the best evaluation so far, and when patience runs out.

``train.early_stop`` evaluates every ``every`` steps; an evaluation improves on the best when
its metric is higher (AUC) or lower (log loss). An undefined metric (NaN: the AUC of a one-class
split) never improves. After ``patience`` evaluations in a row without improvement the run
stops. ``train.keep_best`` keeps a checkpoint of each new best (the trainer's business).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from cosparse.config.objective import HIGHER_IS_BETTER
from cosparse.config.train import EarlyStopConfig


@dataclass
class Verdict:
    """What one evaluation means for the run."""

    improved: bool
    stop: bool


@dataclass
class EarlyStopper:
    """Tracks the best evaluation of ``cfg.metric`` and the evaluations since it."""

    cfg: EarlyStopConfig
    best_step: int | None = None
    best_value: float | None = None
    best_scores: dict[str, Any] = field(default_factory=dict)
    since_best: int = 0  # evaluations in a row without improvement
    stopped_at: int | None = None

    def due(self, step: int) -> bool:
        return step % self.cfg.every == 0

    def _better(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.best_value is None:
            return True
        higher = self.cfg.metric.split(".")[0] in HIGHER_IS_BETTER
        return value > self.best_value if higher else value < self.best_value

    def observe(self, step: int, scores: dict[str, Any], can_stop: bool = True) -> Verdict:
        """The evaluation at ``step``; ``stop`` once patience has run out (never when
        ``can_stop`` is False: the evaluation at the end of a run that ran to its end)."""
        value = float(scores.get(self.cfg.metric, math.nan))
        if self._better(value):
            self.best_step, self.best_value, self.best_scores = step, value, dict(scores)
            self.since_best = 0
            return Verdict(improved=True, stop=False)
        self.since_best += 1
        stop = can_stop and self.since_best >= self.cfg.patience
        if stop and self.stopped_at is None:
            self.stopped_at = step
        return Verdict(improved=False, stop=stop)

    def describe(self) -> str:
        """One line for the log: where it stopped and the best evaluation."""
        where = (f"stopped early at step {self.stopped_at} ({self.cfg.patience} evaluations "
                 "without improvement)" if self.stopped_at is not None else "ran to the end")
        best = ("no evaluation had a defined " + self.cfg.metric if self.best_step is None
                else f"best {self.cfg.metric} {self.best_value:.6f} at step {self.best_step}")
        return f"early stopping: {where}; {best}"

    def figures(self) -> dict[str, Any]:
        """For the final line: ``early_stopped_at`` (None: it ran to the end), ``best_step``,
        ``best_metric`` (its name: ``best_metric_name``)."""
        return {"early_stopped_at": self.stopped_at, "best_step": self.best_step,
                "best_metric": self.best_value, "best_metric_name": self.cfg.metric}

    def state(self) -> dict[str, Any]:
        """What a resumed run needs to go on comparing with the same best."""
        return {"best_step": self.best_step, "best_value": self.best_value,
                "best_scores": self.best_scores, "metric": self.cfg.metric}

    def load_state(self, state: dict[str, Any]) -> None:
        """The best of the run this one resumes (ignored when it measured another metric)."""
        if state.get("metric") != self.cfg.metric:
            return
        self.best_step, self.best_value = state["best_step"], state["best_value"]
        self.best_scores = dict(state.get("best_scores") or {})
        self.since_best = 0
