"""``model.multitask``: the multi-task models' layers (``model.kind: mmoe | ple | esmm``), and
their rules against the objective's tasks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cosparse.config.errors import ConfigError
from cosparse.config.objective import objective_of

if TYPE_CHECKING:
    from cosparse.config.root import Config

MULTITASK_KINDS = ("mmoe", "ple", "esmm")


@dataclass
class MultiTaskConfig:
    """MMoE: ``experts`` shared experts, a gate and a tower per task. PLE: ``levels`` layers of
    ``experts`` shared and ``specific`` per-task experts. ESMM: a CTR and a CVR tower, trained
    on ``tasks`` = [CTR task, CTCVR task]."""

    experts: int = 4  # MMoE's experts; PLE's shared experts per level
    specific: int = 1  # PLE: each task's own experts per level
    levels: int = 2  # PLE: extraction (CGC) layers
    expert: list[int] = field(default_factory=lambda: [64, 32])  # an expert's layer widths
    tower: list[int] = field(default_factory=lambda: [32])  # each tower's hidden widths
    tasks: list[str] = field(default_factory=list)  # ESMM: [ctr, ctcvr]; [] = the objective's


def esmm_tasks(cfg: Config) -> list[str]:
    """ESMM's [CTR task, CTCVR task]: ``model.multitask.tasks``, or the objective's two."""
    return list(cfg.model.multitask.tasks) or list(objective_of(cfg.objective).tasks)


def validate_multitask(cfg: Config) -> None:
    """MMoE's experts, the experts' layers, and for ESMM two binary tasks of the objective."""
    m = cfg.model.multitask  # (each count's and width's range: bounds.py)
    if cfg.model.kind == "mmoe" and m.experts < 1:
        raise ConfigError(f"model.multitask.experts: MMoE mixes one expert or more, got "
                          f"{m.experts}")
    if not m.expert:
        raise ConfigError("model.multitask.expert: an expert needs one or more layer sizes")
    tasks = objective_of(cfg.objective).tasks
    if m.tasks and cfg.model.kind != "esmm":
        raise ConfigError(f"model.multitask.tasks: names ESMM's CTR and CTCVR tasks; "
                          f"model.kind '{cfg.model.kind}' has a tower for every task of the "
                          "objective")
    if cfg.model.kind != "esmm":
        return
    names = esmm_tasks(cfg)
    if len(names) != 2 or sorted(names) != sorted(tasks):
        raise ConfigError(f"model.multitask.tasks: ESMM trains two binary tasks, the CTR task "
                          f"then the CTCVR task (e.g. [click, buy]); the objective's tasks are "
                          f"{sorted(tasks)}, got {names}")
    for name in names:
        if tasks[name].kind != "binary":
            raise ConfigError(f"objective.tasks.{name}.kind: ESMM's tasks are binary (CTR and "
                              f"CTCVR probabilities), got {tasks[name].kind!r}")
