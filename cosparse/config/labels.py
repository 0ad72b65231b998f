"""``data.columns.label``: which column holds the label and how its values become 0/1.

A plain column name (``label: click``) is a column of 0/1 values. The mapping form says how other
values map: ``{column: rating, threshold: 4}`` (positive when the value is at least 4) or
``{column: y, positive: [1]}`` (positive when the value is one of the list: compared as numbers
when the column holds numbers, as text when it holds text). ``cosparse.features.label_map``
applies it to a column's values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cosparse.config.errors import ConfigError

LabelValue = int | float | str

KEY = "data.columns.label"


@dataclass
class LabelConfig:
    """The label column and its mapping to 0/1 (None, None: its values are 0 or 1)."""

    FROM_STRING: ClassVar[str] = "column"  # ``label: click`` is ``label: {column: click}``
    column: str = "label"
    positive: list[LabelValue] | None = None
    threshold: float | None = None

    @property
    def mapped(self) -> bool:
        return self.positive is not None or self.threshold is not None

    def describe(self) -> str:
        """How the values map, for messages and start-up lines."""
        if self.threshold is not None:
            return f"positive when {self.column} >= {self.threshold:g}"
        if self.positive is not None:
            return f"positive when {self.column} is one of {self.positive}"
        return f"{self.column} holds 0/1"


def as_label(value: str | LabelConfig) -> LabelConfig:
    """A label given by column name or in full."""
    return LabelConfig(column=value) if isinstance(value, str) else value


def validate_label(label: LabelConfig, reader: str) -> None:
    """A column name (``label`` for reader libsvm), and at most one of positive (a non-empty
    list) and threshold."""
    if not label.column:
        raise ConfigError(f"{KEY}.column: name the label column")
    if reader == "libsvm" and label.column != "label":
        raise ConfigError(f"{KEY}.column: reader libsvm names its label column 'label' (each "
                          f"line's first token), got '{label.column}'")
    if label.positive is not None and label.threshold is not None:
        raise ConfigError(f"{KEY}: positive and threshold both map the label; give one of them")
    if label.positive is not None and not label.positive:
        raise ConfigError(f"{KEY}.positive: list the label values that are positive, e.g. [1]")


def mapping_hint(column: str) -> str:
    """What to set when a label column holds values other than 0/1."""
    return (f"set {KEY}: {{column: {column}, positive: [...]}} or "
            f"{{column: {column}, threshold: x}} to map its values")


# the readers that read several tasks' labels, and those that read the weight column
TASK_READERS = ("csv", "parquet", "interactions", "taobao_events")
WEIGHT_READERS = ("csv", "parquet")
BEHAVIOUR_COLUMN = "behavior_type"  # reader taobao_events: the column its tasks' labels map
BEHAVIOURS = ("pv", "cart", "fav", "buy")  # its values


def validate_targets(reader: str, labels: dict[str, LabelConfig], weight: str | None
                     ) -> dict[str, str]:
    """data.columns.labels and weight: readers of ``TASK_READERS`` (the weight: of
    ``WEIGHT_READERS``), each mapping well-formed, no two tasks with the same labels (one column
    may serve several tasks by different mappings); reader taobao_events maps its behaviour
    column by ``positive`` lists of ``BEHAVIOURS``. Returns their columns' roles."""
    if labels and reader not in TASK_READERS:
        raise ConfigError(f"data.columns.labels: several tasks' labels are read by readers "
                          f"{', '.join(TASK_READERS)}, not '{reader}'"
                          + (" (its lines hold one label, their first token; map it with "
                             "data.columns.label)" if reader == "libsvm" else ""))
    named: dict[str, str] = {}
    rules: dict[str, str] = {}
    plain: set[str] = set()  # columns a task reads as 0/1 (no other task may read them)
    for task, rule in labels.items():
        key = f"data.columns.labels.{task}"
        try:
            validate_label(rule, reader)
        except ConfigError as e:
            raise ConfigError(str(e).replace("data.columns.label", key, 1)) from None
        if reader == "taobao_events":
            _validate_behaviours(key, rule)
        if rule.column in named and (not rule.mapped or rule.column in plain):
            raise ConfigError(f"{key}: column '{rule.column}' is already {named[rule.column]} "
                              "(a column serves several tasks only mapped: positive or threshold)")
        same = repr((rule.column, rule.positive, rule.threshold))
        if same in rules:
            raise ConfigError(f"{key}: gives task {task} the labels of task {rules[same]} "
                              f"({rule.describe()}); map the column another way or drop a task")
        rules[same] = task
        named[rule.column] = f"the label of task {task}"
        if not rule.mapped:
            plain.add(rule.column)
    if weight is not None:
        if reader not in WEIGHT_READERS:
            raise ConfigError(f"data.columns.weight: per-sample weights are read by readers "
                              f"{', '.join(WEIGHT_READERS)}, not '{reader}'")
        if not weight or weight in named:
            raise ConfigError(f"data.columns.weight: a column of its own, got {weight!r}")
        named[weight] = "the weight"
    return named


def validate_event_labels(reader: str, positive: list[str] | None,
                          labels: dict[str, LabelConfig], labels_only: bool) -> None:
    """``data.events.positive`` (None: buy) names known behaviours, and is not given beside
    ``data.columns.labels``; reader taobao_events takes ``data.columns.labels`` alone of
    ``data.columns`` (``labels_only``: nothing else is set)."""
    bad = [b for b in positive or ["buy"] if b not in BEHAVIOURS]
    if positive == [] or bad:
        raise ConfigError(f"data.events.positive: need behaviours among {', '.join(BEHAVIOURS)}"
                          f" (got {positive})")
    if positive is not None and labels:
        raise ConfigError("data.events.positive and data.columns.labels both label the samples "
                          f"(events.positive: {positive}); with several tasks each task's "
                          "labels say which behaviours are positive: drop data.events.positive")
    if reader == "taobao_events" and not labels_only:
        raise ConfigError("data.columns: reader taobao_events has columns of its own; it takes "
                          "data.columns.labels only (several tasks, each {column: "
                          f"{BEHAVIOUR_COLUMN}, positive: [behaviours]}})")


def _validate_behaviours(key: str, rule: LabelConfig) -> None:
    """A task of reader taobao_events: ``{column: behavior_type, positive: [...]}`` of known
    behaviours."""
    if rule.column != BEHAVIOUR_COLUMN or rule.positive is None:
        raise ConfigError(f"{key}: reader taobao_events labels a task by the behaviours that "
                          f"are positive: {{column: {BEHAVIOUR_COLUMN}, positive: [cart, fav, "
                          f"buy]}} (its column is {BEHAVIOUR_COLUMN}), got {rule.describe()}")
    bad = [b for b in rule.positive if b not in BEHAVIOURS]
    if bad:
        raise ConfigError(f"{key}.positive: behaviours among {', '.join(BEHAVIOURS)}, got "
                          f"{bad}")
