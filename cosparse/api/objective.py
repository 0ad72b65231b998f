"""``cosparse.Objective``: the tasks a model of the user's own is trained on, in Python; the
same thing as the config's ``objective`` section (``cosparse.config.objective``), which it
becomes, so the two give the same numbers."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from cosparse.config import Config, ConfigError, from_dict
from cosparse.config.objective import ObjectiveConfig, TaskConfig


class Objective:
    """One entry per task: ``Objective({"ctr": {"kind": "binary"}, "watch": {"kind":
    "regression", "loss": "huber", "delta": 2.0, "weight": 0.5, "mask": "ctr"}})`` (or the
    tasks as keyword arguments; a ``TaskConfig`` serves as an entry too)."""

    def __init__(self, tasks: Mapping[str, Mapping[str, Any] | TaskConfig] | None = None,
                 **more: Mapping[str, Any] | TaskConfig) -> None:
        entries = {**(tasks or {}), **more}
        if not entries:
            raise ConfigError("objective.tasks: name one task or more, e.g. "
                              "cosparse.Objective({'ctr': {'kind': 'binary'}})")
        plain = {name: (copy.deepcopy(t.__dict__) if isinstance(t, TaskConfig) else dict(t))
                 for name, t in entries.items()}
        self.config: ObjectiveConfig = from_dict(ObjectiveConfig, {"tasks": plain}, "objective")

    @property
    def tasks(self) -> list[str]:
        return list(self.config.tasks)

    def __repr__(self) -> str:
        return f"Objective({self.config.tasks!r})"


def with_objective(cfg: Config, objective: Objective | None) -> Config:
    """``cfg`` with ``objective``'s tasks as its ``objective`` section (None: as it is); one
    that gives another objective already is refused."""
    if objective is None:
        return cfg
    if not isinstance(objective, Objective):
        raise TypeError(f"cosparse.Trainer(objective=...): a cosparse.Objective, not a "
                        f"{type(objective).__name__}")
    if cfg.objective is not None and cfg.objective != objective.config:
        raise ConfigError("objective: the config's objective section and the Trainer's "
                          "objective= differ; give the objective in one place")
    out = copy.copy(cfg)
    out.objective = copy.deepcopy(objective.config)
    return out
