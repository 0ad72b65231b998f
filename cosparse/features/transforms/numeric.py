"""Numeric transforms: ``log1p``, ``clip`` and ``fill_missing``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cosparse.data.errors import DataError
from cosparse.features.transforms.base import (
    NUM,
    BadParam,
    Mismatch,
    Param,
    TransformDef,
    check_numeric,
    like,
    one_input,
)
from cosparse.features.types import FLOAT, INT, LIST_FLOAT, STRING, ColType, Column, element_kind, is_list


# --- log1p, clip, fill_missing -------------------------------------------------------------------
def _log1p_check(p: dict[str, Any], types: list[ColType]) -> ColType:
    t = one_input(types, "log1p")
    check_numeric(t, "log1p")
    return ColType(LIST_FLOAT if is_list(t.kind) else FLOAT)


def _log1p_apply(p: dict[str, Any], cols: list[Column], state: Any) -> Column:
    c = cols[0]
    x = c.values.astype(np.float64)
    bad = x < -1.0
    if c.present is not None:
        bad &= np.repeat(c.present, c.lengths) if c.lengths is not None else c.present
    if bad.any():
        raise DataError(f"log1p: {int(bad.sum())} values below -1 (first {x[bad][0]!r}); clip first")
    return like(c, LIST_FLOAT if is_list(c.kind) else FLOAT, np.log1p(x))


def _clip_norm(p: dict[str, Any], base: Path | None) -> dict[str, Any]:
    if p.get("min") is None and p.get("max") is None:
        raise BadParam("give min, max or both")
    if p.get("min") is not None and p.get("max") is not None and p["min"] > p["max"]:
        raise BadParam(f"min {p['min']} is above max {p['max']}")
    return p


def _clip_kind(p: dict[str, Any], kind: str) -> str:
    ints = all(isinstance(p.get(k), int | None) for k in ("min", "max"))
    if element_kind(kind) == INT and ints:
        return kind
    return LIST_FLOAT if is_list(kind) else FLOAT


def _clip_check(p: dict[str, Any], types: list[ColType]) -> ColType:
    t = one_input(types, "clip")
    check_numeric(t, "clip")
    return ColType(_clip_kind(p, t.kind))


def _clip_apply(p: dict[str, Any], cols: list[Column], state: Any) -> Column:
    c = cols[0]
    kind = _clip_kind(p, c.kind)
    x = c.values if element_kind(kind) == INT else c.values.astype(np.float64)
    return like(c, kind, np.clip(x, p.get("min"), p.get("max")))


def _fill_check(p: dict[str, Any], types: list[ColType]) -> ColType:
    t = one_input(types, "fill_missing")
    if is_list(t.kind):
        raise Mismatch(f"fill_missing needs a scalar column, got {t.kind} (an empty list is a value)")
    if t.kind == STRING:
        raise Mismatch("fill_missing needs a numeric column, got string (use vocab or hash)")
    if t.kind == INT and isinstance(p["value"], int):
        return ColType(INT, t.categorical)
    return ColType(FLOAT, t.categorical)


def _fill_apply(p: dict[str, Any], cols: list[Column], state: Any) -> Column:
    c = cols[0]
    kind = INT if c.kind == INT and isinstance(p["value"], int) else FLOAT
    x = c.values if kind == INT else c.values.astype(np.float64)
    if c.present is not None:
        x = np.where(c.present, x, p["value"]).astype(x.dtype)
    return Column(kind, x, None, None, None, c.categorical)


LOG1P = TransformDef("log1p", {}, _log1p_check, _log1p_apply)
CLIP = TransformDef("clip", {"min": Param(NUM), "max": Param(NUM)}, _clip_check, _clip_apply,
                    normalize=_clip_norm)
FILL_MISSING = TransformDef("fill_missing", {"value": Param(NUM, required=True)},
                            _fill_check, _fill_apply)
