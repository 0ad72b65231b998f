"""Plain data of the tuning agent: a knob, the budgets, and one trial's measurement."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

KnobClass = Literal["exact", "reordering", "semantic"]


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
class Measurement:
    """One short run: throughput per measured window after warm-up, what it cost, and digests
    of its losses and rows (equal for configurations that train the same numbers)."""

    windows: list[float] = field(default_factory=list)  # samples/s per window
    device_bytes: float = 0.0
    host_bytes: float = 0.0
    ps_bytes_per_step: float = 0.0
    loss_digest: str = ""
    row_digest: str = ""
    auc: float | None = None  # held-out AUC and log loss (semantic trials, which evaluate)
    logloss: float | None = None
    error: str | None = None  # the run crashed or ran out of memory: an infeasible trial
    pruned: bool = False

    @property
    def samples_per_s(self) -> float:
        return median(self.windows)

    def figures(self) -> dict[str, float]:
        return {"samples_per_s": self.samples_per_s, "device_bytes": self.device_bytes,
                "host_bytes": self.host_bytes, "ps_bytes_per_step": self.ps_bytes_per_step}
