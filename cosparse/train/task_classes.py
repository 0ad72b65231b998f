"""Each binary task's classes on the eval side, checked at start-up as the one-label split is
(``row_split.check_sides``): an eval side whose labels of a binary task are all one class leaves
that task's AUC undefined, so the run is refused naming the task, unless
``data.allow_one_class_eval: true`` (then a warning line). A masked task is checked on the
samples its mask keeps, as it is scored."""

from __future__ import annotations

import numpy as np

from cosparse.config import Config, ConfigError
from cosparse.config.objective import ObjectiveConfig, objective_of


def one_class_tasks(objective: ObjectiveConfig, labels: dict[str, np.ndarray]
                    ) -> dict[str, tuple[int, float]]:
    """The binary tasks whose labels (0/1, NaN where unknown) hold one class on the samples
    they are scored on: task -> (their count, that class). A side without samples is not
    checked."""
    out: dict[str, tuple[int, float]] = {}
    for name, task in objective.tasks.items():
        if task.kind != "binary" or name not in labels:
            continue
        y = labels[name]
        keep = np.isfinite(y)
        if task.mask is not None and task.mask in labels:
            keep &= labels[task.mask] > 0.5
        y = y[keep]
        if len(y) and y.min() == y.max():
            out[name] = (int(len(y)), float(y[0]))
    return out


def task_class_notes(cfg: Config, labels: dict[str, np.ndarray]) -> list[str]:
    """The start-up lines of the eval side's task classes (none when each binary task has
    both); a ConfigError naming the task and ``data.allow_one_class_eval`` unless it is set."""
    if not labels:
        return []
    found = one_class_tasks(objective_of(cfg.objective), labels)
    said = [f"task {t}: its {n:,} eval samples are all label {int(c)}" for t, (n, c)
            in found.items()]
    if said and not cfg.data.allow_one_class_eval:
        raise ConfigError(f"data.columns.labels: on the eval side, {'; '.join(said)}: AUC is "
                          "undefined (data.allow_one_class_eval: true runs anyway)")
    return [f"warning: {s} (AUC undefined)" for s in said]
