"""Label columns to 0/1 by ``data.columns.label`` (``cosparse.config.labels``), whole columns at
a time: the csv, parquet, interactions and libsvm readers and ``cosparse data describe`` share it.

Without a mapping a label is a number equal to 0 or 1 (anything else is a bad record). With
``threshold`` a row is positive when its number is at least the threshold; with ``positive`` when
its value is one of the list, compared as numbers in a column of numbers and as text in a column
of text. A missing value, or text where a number is needed, is a bad record.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cosparse.config import LabelConfig
from cosparse.config.labels import KEY, LabelValue, mapping_hint
from cosparse.data.errors import DataError
from cosparse.features import csv_columns as CC
from cosparse.features.types import FLOAT, INT, STRING, Column, from_arrow_strings


def column_labels(col: Column, rule: LabelConfig) -> tuple[np.ndarray, np.ndarray]:
    """(labels float32, bad rows) of one scalar label column (int, float or string)."""
    present = col.present_mask()
    if col.kind in (INT, FLOAT):
        v = col.values.astype(np.float64)
        if rule.threshold is not None:
            pos, bad = v >= rule.threshold, ~present
        elif rule.positive is not None:
            pos, bad = np.isin(v, _numbers(rule.positive, rule.column)), ~present
        else:
            pos, bad = v == 1.0, ~present | ((v != 0.0) & (v != 1.0))
    elif col.kind == STRING and rule.positive is not None:
        text = pa.LargeStringArray.from_buffers(col.num_rows, pa.py_buffer(col.offsets),
                                                pa.py_buffer(col.values))
        value_set = pa.array([_text(p) for p in rule.positive], pa.large_string())
        pos = np.asarray(pc.is_in(text, value_set=value_set).to_numpy(zero_copy_only=False),
                         np.bool_)
        bad = ~present
    else:
        how = "a threshold compares" if rule.threshold is not None else "0/1 labels are"
        raise DataError(f"column {rule.column} (label) holds {col.kind} values, but {how} "
                        f"numbers; {mapping_hint(rule.column)}")
    return np.where(bad, False, pos).astype(np.float32), bad


def text_labels(text: pa.Array, rule: LabelConfig, type_name: str
                ) -> tuple[np.ndarray, np.ndarray]:
    """(labels, bad rows) of a CSV label column read as text (``type_name``: its column type)."""
    if not rule.mapped:
        return CC.labels(text)
    numeric = rule.threshold is not None or type_name != "string"
    col, unreadable = CC.convert(text, "float32" if numeric else "string", "|")
    labels, bad = column_labels(col, rule)
    return labels, bad | unreadable


def arrow_labels(arr: pa.Array, rule: LabelConfig) -> tuple[np.ndarray, np.ndarray]:
    """(labels, bad rows) of a Parquet label column (numbers, booleans, or text with
    ``positive``)."""
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), np.bool_)
    if pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type) or \
            pa.types.is_boolean(arr.type):
        v = np.asarray(arr.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False))
        present = valid & ~np.isnan(v)
        return column_labels(Column(FLOAT, np.nan_to_num(v), present), rule)
    if (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)) and rule.mapped:
        if rule.threshold is not None:
            col, unreadable = CC.convert(arr.cast(pa.large_string()), "float32", "|")
            labels, bad = column_labels(col, rule)
            return labels, bad | unreadable
        return column_labels(from_arrow_strings(arr), rule)
    raise DataError(f"column {rule.column} (label) has unsupported type {arr.type}"
                    + ("" if rule.mapped else f"; {mapping_hint(rule.column)}"))


def bad_label_note(rule: LabelConfig) -> str:
    """Why a label value is a bad record, for the message naming it."""
    return f"missing or not a number; {rule.describe()}" if rule.mapped else "expected 0 or 1"


def bad_label_hint(rule: LabelConfig) -> str:
    """What to set, after the message naming a label value that is not 0/1 ("" when mapped)."""
    return "" if rule.mapped else f"; {mapping_hint(rule.column)}"


def _numbers(values: list[LabelValue], column: str) -> np.ndarray:
    out = []
    for v in values:
        try:
            out.append(float(v))
        except ValueError:
            raise DataError(f"{KEY}.positive: {v!r} is not a number, but column {column} holds "
                            "numbers") from None
    return np.array(out, np.float64)


def _text(value: LabelValue) -> str:
    """A positive value as the text a column of text holds (1 and 1.0 alike are '1')."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
