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


def validate_targets(reader: str, labels: dict[str, LabelConfig], weight: str | None
                     ) -> dict[str, str]:
    """data.columns.labels and weight: readers csv and parquet, one column per task, each
    mapping well-formed; returns their columns' roles."""
    if reader not in ("csv", "parquet"):
        raise ConfigError(f"data.columns.labels: several tasks' labels and data.columns.weight "
                          f"are read by readers csv and parquet, not '{reader}'")
    named: dict[str, str] = {}
    for task, rule in labels.items():
        key = f"data.columns.labels.{task}"
        try:
            validate_label(rule, reader)
        except ConfigError as e:
            raise ConfigError(str(e).replace("data.columns.label", key, 1)) from None
        if rule.column in named:
            raise ConfigError(f"{key}: column '{rule.column}' is already {named[rule.column]}")
        named[rule.column] = f"the label of task {task}"
    if weight is not None:
        if not weight or weight in named:
            raise ConfigError(f"data.columns.weight: a column of its own, got {weight!r}")
        named[weight] = "the weight"
    return named
