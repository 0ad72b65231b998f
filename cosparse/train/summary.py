"""The run summary: the figures of a whole ``Trainer.run``, beside its last interval's.

Throughput, step-time percentiles and stage times are over the steps after the timing warm-up
(``train.timing_warmup_steps``: the first steps a process trains, compilation and first fills),
or over every step when the run is no longer than the warm-up; the mean loss is over every step
whose loss counts. Wall time runs from the end of the warm-up to the summary, periodic
evaluations and checkpoints included. The counters (bytes per link, hit rates) are the trainer's
over the whole run (``IntervalCounters`` created at its start).
"""

from __future__ import annotations

from typing import Any

from cosparse.train.metrics import IntervalStats


class RunSummary:
    """Accumulates every step of one ``Trainer.run`` for its summary."""

    def __init__(self, warmup_left: int) -> None:
        """``warmup_left``: steps still to train before the timed part starts (the process's
        warm-up not yet spent: 0 on a second ``run`` of the same trainer)."""
        self.warmup_left = warmup_left
        self.every = IntervalStats()  # every step: the mean loss, and timing if all are warm-up
        self.timed = IntervalStats()  # the steps after the warm-up

    def add_step(self, samples: int, loss: float, step_ms: float, stages: dict[str, float],
                 skipped: bool = False) -> None:
        self.every.add_step(samples, loss, step_ms, stages, skipped=skipped)
        if self.warmup_left > 0:
            self.warmup_left -= 1
            if self.warmup_left == 0:
                self.timed.reset()  # its clock starts when the warm-up ends
            return
        self.timed.add_step(samples, loss, step_ms, stages, skipped=skipped)

    @property
    def steps(self) -> int:
        return self.every.steps

    def figures(self) -> dict[str, Any]:
        """``loss`` (mean over the run), ``samples_per_s``, ``step_ms_p50/p99`` and
        ``stage_ms.*`` (over the timed steps), ``timed_steps`` and ``steps_trained``."""
        timed = self.timed if self.timed.steps else self.every
        out: dict[str, Any] = timed.summary()
        out["loss"] = self.every.summary()["loss"]
        out["timed_steps"] = timed.steps
        out["steps_trained"] = self.every.steps
        return out
