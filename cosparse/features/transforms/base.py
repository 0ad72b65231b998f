"""The contract of a feature transform (``TransformDef``, its ``Param``s, the ``Mismatch`` and
``BadParam`` errors) and the small helpers the transforms share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cosparse.features.types import STRING, ColType, Column, element_kind, is_list


class Mismatch(Exception):
    """A transform does not accept its input types (wrapped into FeatureSpecError by the spec)."""


class BadParam(Exception):
    """A parameter value is invalid (wrapped into FeatureSpecError by the spec)."""


@dataclass(frozen=True)
class Param:
    types: tuple[type, ...]
    required: bool = False
    default: Any = None
    doc: str = ""


@dataclass(frozen=True)
class TransformDef:
    name: str
    params: dict[str, Param]
    check: Callable[[dict[str, Any], list[ColType]], ColType]
    apply: Callable[[dict[str, Any], list[Column], Any], Column]
    multi_input: bool = False  # takes all the feature's inputs (cross, history); must come first
    normalize: Callable[[dict[str, Any], Path | None], dict[str, Any]] | None = None
    prepare: Callable[[dict[str, Any]], Any] | None = None


NUM = (int, float)


def one_input(types: list[ColType], op: str) -> ColType:
    """The single input type of ``op`` (a Mismatch when it has several)."""
    if len(types) != 1:
        raise Mismatch(f"{op} takes one input column, got {len(types)} (use cross or history to "
                       f"combine columns)")
    return types[0]


def check_numeric(t: ColType, op: str, allow_lists: bool = True) -> None:
    """A Mismatch unless ``t`` holds numbers (not strings, not IDs; lists only when allowed)."""
    ek = element_kind(t.kind)
    if ek == STRING:
        raise Mismatch(f"{op} needs a numeric column, got {t.kind}")
    if is_list(t.kind) and not allow_lists:
        raise Mismatch(f"{op} needs a scalar column, got {t.kind}")
    if t.categorical:
        raise Mismatch(f"{op} needs numeric values, got IDs (the output of hash/cross/vocab/"
                       f"bucketize)")


def like(col: Column, kind: str, values: np.ndarray, present: np.ndarray | None = "same",  # type: ignore
          categorical: bool | None = None) -> Column:
    """A column shaped like ``col`` (presence, lengths) with new values and kind."""
    return Column(kind, values, col.present if isinstance(present, str) else present, col.lengths,
                  None, col.categorical if categorical is None else categorical)


def buckets_of(params: dict[str, Any]) -> int:
    """The ``buckets`` parameter of hash and cross (0: no modulo)."""
    b = params.get("buckets")
    return 0 if b is None else int(b)
