"""Plain data of the tuning agent: a knob, the budgets, a trial's replay window, and one
trial's measurement."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Literal

KnobClass = Literal["exact", "reordering", "semantic"]


def task_metric(final: dict[str, Any], metric: str) -> dict[str, float]:
    """Each task's ``metric`` (``auc``, ``logloss``) of a run's final metrics: its
    ``<metric>.<task>`` entries, or the one task's ``<metric>`` as task ``label``."""
    out = {k.split(".", 1)[1]: float(v) for k, v in final.items()
           if k.startswith(f"{metric}.") and v is not None}
    if not out and final.get(metric) is not None:
        out = {"label": float(final[metric])}
    return out


def median(values: list[float]) -> float:
    """The middle window's figure (the upper one of an even count; 0 for none)."""
    w = sorted(values)
    return w[len(w) // 2] if w else 0.0


@dataclass(frozen=True)
class Knob:
    """One setting the agent may change: its dotted config key and the values it may take
    (the start's value among them)."""

    key: str
    choices: tuple[Any, ...]
    kind: KnobClass = "exact"  # exact: the results must stay bit-identical to the start's


@dataclass(frozen=True)
class Budgets:
    """Limits a configuration must keep (None: none): Optuna constraints, never penalties."""

    device_bytes: int | None = None
    host_bytes: int | None = None
    ps_bytes_per_step: float | None = None

    def violations(self, figures: dict[str, float]) -> list[float]:
        """Each budget's excess (<= 0 within it; -1 without a budget), in budget order: Optuna's
        constraint values."""
        out = []
        for name, limit in (("device_bytes", self.device_bytes), ("host_bytes", self.host_bytes),
                            ("ps_bytes_per_step", self.ps_bytes_per_step)):
            out.append(-1.0 if limit is None else float(figures.get(name, 0.0)) - float(limit))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"device_bytes": self.device_bytes, "host_bytes": self.host_bytes,
                "ps_bytes_per_step": self.ps_bytes_per_step}


@dataclass
class Window:
    """The replay window every trial trains: ``warmup_steps``, then ``windows`` measured windows
    of ``window_steps`` each. The trial logs an interval every gcd(warm-up, window) steps, so
    the warm-up ends on an interval's end and a window is whole intervals past it."""

    warmup_steps: int = 4
    windows: int = 6
    window_steps: int = 4

    @property
    def log_every(self) -> int:
        return math.gcd(self.warmup_steps, self.window_steps)

    def config(self, raw: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(raw)
        train = out.setdefault("train", {})
        train.update(steps=self.warmup_steps + self.windows * self.window_steps,
                     log_every=self.log_every, progress=False, metrics_json=None,
                     tensorboard_dir=None, checkpoint={})
        return out


@dataclass
class Measurement:
    """One short run: throughput per measured window after warm-up, what it cost, and digests
    of its losses and rows (equal for configurations that train the same numbers)."""

    windows: list[float] = field(default_factory=list)  # samples/s per window
    spans: list[tuple[int, int]] = field(default_factory=list)  # each window's first, last step
    device_bytes: float = 0.0
    host_bytes: float = 0.0
    ps_bytes_per_step: float = 0.0
    loss_digest: str = ""
    row_digest: str = ""
    auc: float | None = None  # held-out AUC and log loss (semantic trials, which evaluate)
    logloss: float | None = None
    # each binary task's held-out AUC and log loss (one task: {"label": auc})
    aucs: dict[str, float] = field(default_factory=dict)
    loglosses: dict[str, float] = field(default_factory=dict)
    error: str | None = None  # the run crashed or ran out of memory: an infeasible trial
    pruned: bool = False

    @property
    def samples_per_s(self) -> float:
        return median(self.windows)

    def figures(self) -> dict[str, float]:
        return {"samples_per_s": self.samples_per_s, "device_bytes": self.device_bytes,
                "host_bytes": self.host_bytes, "ps_bytes_per_step": self.ps_bytes_per_step}
