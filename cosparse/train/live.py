"""Changing exact knobs of a running trainer between intervals: the live tuning agent's reach.

The data stream and the planner thread stop at a batch boundary, the settings change, and the
stream starts again at the next batch, as after a fallback. The knobs (``LIVE_KNOBS``) move work
between threads and processes, or rows between tiers (a tier resized evicts as it always does),
so what the run computes does not change. ``supply.path`` switches architecture B between the
workers' rows (``collaborative``) and the trainer's own pulls over the same tiers
(``ps-tiered``, what a fallback does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cosparse.config import Config
from cosparse.config.train import LIVE_KNOBS, LIVE_PATHS


@dataclass(frozen=True)
class Reconfigure:
    """What an ``on_interval`` callback may answer: settings to change before the next batch,
    why, and who asks (written to the metrics with the step)."""

    changes: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    by: str = ""


def set_live(cfg: Config, changes: dict[str, Any]) -> None:
    """Set live knobs (dotted keys of ``LIVE_KNOBS``) on ``cfg``, in place."""
    for key, value in changes.items():
        if key not in LIVE_KNOBS:
            raise ValueError(f"{key}: not a live knob (live knobs: {', '.join(LIVE_KNOBS)})")
        *path, name = key.split(".")
        if key == "supply.path":
            if value not in LIVE_PATHS:
                raise ValueError(f"{key}: {value!r} is not one of {', '.join(LIVE_PATHS)}")
        elif not isinstance(value, int) or value < (0 if name in ZERO_OK else 1):
            raise ValueError(f"{key}: {value!r} is not a valid value")
        node: Any = cfg
        for part in path:
            node = getattr(node, part)
        setattr(node, name, value)


ZERO_OK = ("lookahead", "horizon", "workers")
