"""The ``objective`` section: the tasks a model is trained on, each with its kind, loss, weight
in the total loss and mask (``objective: {tasks: {NAME: {kind, loss, delta, weight, mask}}}``).

Without the section the objective is one binary task named ``label`` (binary cross-entropy on
``data.columns.label``), as before objectives existed. ``cosparse.train.objective`` computes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from cosparse.config.errors import ConfigError

LOSSES = {"binary": ("bce",), "regression": ("mse", "huber"), "retrieval": ("sampled_softmax",)}
METRICS = {"binary": ("auc", "logloss"), "regression": ("mse", "mae"),
           "retrieval": ("recall@10", "ndcg@10", "mrr")}
HIGHER_IS_BETTER = ("auc", "gauc", "recall@10", "ndcg@10", "mrr")


@dataclass
class TaskConfig:
    """One task: ``binary`` (loss ``bce``), ``regression`` (``mse``, or ``huber`` with
    ``delta``) or ``retrieval`` (``sampled_softmax`` over the batch's items at ``temperature``,
    a two-tower model's); ``weight``: its share of the total loss; ``mask``: a binary task whose
    label 1 marks the samples this task trains on (None: every sample); ``group_by``: a sparse
    feature whose values group the samples of ``gauc.<task>`` (a binary task's)."""

    kind: Literal["binary", "regression", "retrieval"] = "binary"
    # None: bce (binary), mse (regression), sampled_softmax (retrieval)
    loss: Literal["bce", "mse", "huber", "sampled_softmax"] | None = None
    delta: float = 1.0
    temperature: float = 0.05  # retrieval: the softmax's temperature over cosine scores
    # retrieval: also rank each target against this many uniformly drawn items (metrics
    # recall@10.sampled<n>, ...: not comparable with the full corpus's); 0: the corpus only
    sampled_eval: int = 0
    weight: float = 1.0
    mask: str | None = None
    group_by: str | None = None  # a binary task's gauc.<task>: AUC per value of this feature

    @property
    def loss_name(self) -> str:
        return self.loss or LOSSES[self.kind][0]


@dataclass
class ObjectiveConfig:
    tasks: dict[str, TaskConfig] = field(default_factory=dict)

    @property
    def default(self) -> bool:
        """One binary task named ``label`` with weight 1, no mask and no groups: the exact BCE
        and the evaluation of before objectives."""
        t = self.tasks.get("label")
        return (len(self.tasks) == 1 and t is not None and t.kind == "binary"
                and t.weight == 1.0 and t.mask is None and t.group_by is None)


def objective_of(objective: ObjectiveConfig | None) -> ObjectiveConfig:
    """The configured objective, or the default one (one binary task, ``label``)."""
    return objective if objective is not None else ObjectiveConfig({"label": TaskConfig()})


def validate_objective(objective: ObjectiveConfig | None, label_tasks: list[str] | None) -> None:
    """Each task's loss fits its kind (its numbers' ranges: ``bounds.py``), its mask names a
    binary task (not itself); ``label_tasks``: the tasks ``data.columns.labels`` names (None:
    it names none, so the one task must be ``label``)."""
    if objective is None:
        if label_tasks:
            raise ConfigError(f"data.columns.labels: names tasks {label_tasks}, but there is no "
                              "objective section; give objective.tasks with one entry per task")
        return
    tasks = objective.tasks
    if not tasks:
        raise ConfigError("objective.tasks: name one task or more, e.g. {ctr: {kind: binary}}")
    for name, t in tasks.items():
        key = f"objective.tasks.{name}"
        if not name or "." in name:
            raise ConfigError(f"{key}: a task name is a plain word (it becomes auc.<task>)")
        if t.kind not in LOSSES:
            raise ConfigError(f"{key}.kind: one of {list(LOSSES)}, got {t.kind!r}")
        if t.kind == "retrieval" and (len(tasks) > 1 or t.mask or t.group_by):
            raise ConfigError(f"{key}.kind: a retrieval task is its objective's only task, "
                              "with no mask and no group_by")
        if t.sampled_eval and t.kind != "retrieval":
            raise ConfigError(f"{key}.sampled_eval: ranks a retrieval task's target against "
                              f"sampled items; this task is {t.kind}")
        if t.loss is not None and t.loss not in LOSSES[t.kind]:
            raise ConfigError(f"{key}.loss: a {t.kind} task's loss is one of "
                              f"{list(LOSSES[t.kind])}, got {t.loss!r}")
        if t.group_by is not None and t.kind != "binary":
            raise ConfigError(f"{key}.group_by: groups the AUC of a binary task (gauc); this "
                              "task is a regression")
        if t.mask is not None:
            if t.mask == name or t.mask not in tasks:
                raise ConfigError(f"{key}.mask: names another task of objective.tasks "
                                  f"({sorted(set(tasks) - {name})}), got {t.mask!r}")
            if tasks[t.mask].kind != "binary":
                raise ConfigError(f"{key}.mask: task '{t.mask}' is a regression; a mask is a "
                                  "binary task (its label 1 marks the samples)")
    if any(t.kind == "retrieval" for t in tasks.values()):
        return  # (its labels are the batch's own items: no label column to match)
    want = sorted(tasks)
    have = sorted(label_tasks) if label_tasks else ["label"]
    if want != have:
        raise ConfigError(f"objective.tasks: tasks {want}, but the labels are {have} "
                          "(data.columns.labels: {task: column}; without it the one task is "
                          "'label')")


def validate_metric(metric: str, objective: ObjectiveConfig | None) -> None:
    """``train.early_stop.metric``: ``auc``/``logloss`` (the one task's), or
    ``<metric>.<task>`` of a task of the objective whose kind has that metric."""
    tasks = objective_of(objective).tasks
    names = [f"{m}.{t}" for t, c in tasks.items() if c.kind != "retrieval"
             for m in (*METRICS[c.kind], *(("gauc",) if c.group_by else ()))]
    names += [m for c in tasks.values() if c.kind == "retrieval" for m in METRICS[c.kind]]
    if "label" in tasks and tasks["label"].kind == "binary":
        names = ["auc", "logloss", *names]
    if metric not in names:
        raise ConfigError(f"train.early_stop.metric: {metric!r} is not one of {names}")


def check_group_by(objective: ObjectiveConfig, features: list[str]) -> None:
    """Each ``group_by`` names a feature of the data (``features``: the reader's keys)."""
    for name, t in objective.tasks.items():
        if t.group_by is not None and t.group_by not in features:
            raise ConfigError(f"objective.tasks.{name}.group_by: no feature '{t.group_by}' in "
                              f"the data (its features: {', '.join(features)})")
