"""Sequence transforms: ``truncate`` (with padding) and ``history`` (a time window of a row's
events)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cosparse.data.errors import DataError
from cosparse.features import kernels as K
from cosparse.features.transforms.base import NUM, BadParam, Mismatch, Param, TransformDef, one_input
from cosparse.features.types import (
    FLOAT,
    INT,
    LIST_FLOAT,
    LIST_INT,
    LIST_STRING,
    ColType,
    Column,
    is_list,
)


# --- sequences: truncate / pad, history ----------------------------------------------------------
def _gather(c: Column, idx: np.ndarray, lengths: np.ndarray) -> Column:
    if c.kind == LIST_STRING:
        el = np.diff(c.offsets)  # type: ignore[arg-type]
        starts = c.offsets[:-1][idx]  # type: ignore[index]
        sel = el[idx]
        offsets = np.zeros(len(idx) + 1, np.int64)
        np.cumsum(sel, out=offsets[1:])
        byte_idx = np.repeat(starts - offsets[:-1], sel) + np.arange(int(offsets[-1]))
        return Column(LIST_STRING, c.values[byte_idx], None, lengths, offsets, c.categorical)
    return Column(c.kind, c.values[idx], None, lengths, None, c.categorical)


def _keep_first(p: dict[str, Any]) -> bool:
    """``keep: last`` (the default: the most recent of a time-ordered sequence) or ``first``
    (the most recent of a most-recent-first one)."""
    if p.get("keep", "last") not in ("first", "last"):
        raise BadParam(f"keep must be 'first' or 'last', got {p['keep']!r}")
    return p.get("keep", "last") == "first"


def _truncate_norm(p: dict[str, Any], base: Path | None) -> dict[str, Any]:
    if not isinstance(p["max_len"], int) or p["max_len"] <= 0:
        raise BadParam("max_len must be a positive integer")
    _keep_first(p)
    return p


def _truncate_check(p: dict[str, Any], types: list[ColType]) -> ColType:
    t = one_input(types, "truncate")
    if not is_list(t.kind):
        raise Mismatch(f"truncate is a sequence transform and needs a list column, got {t.kind}")
    if p["pad"] and t.kind == LIST_STRING:
        raise Mismatch("pad needs a numeric sequence, got list_string (hash or vocab it first)")
    return t


def _truncate_apply(p: dict[str, Any], cols: list[Column], state: Any) -> Column:
    c = cols[0]
    idx, lengths = K.truncate_index(c.lengths, int(p["max_len"]), _keep_first(p))
    out = _gather(c, idx, lengths)
    if p["pad"]:
        m = int(p["max_len"])
        pad = K.pad_rows(out.values, lengths, m, out.values.dtype.type(p["pad_value"]))
        out = Column(out.kind, pad, None, np.full(len(lengths), m, np.int64), None, out.categorical)
    return out


def _history_norm(p: dict[str, Any], base: Path | None) -> dict[str, Any]:
    if p["window_s"] <= 0:
        raise BadParam("window_s must be positive")
    if p.get("max_len") is not None and (not isinstance(p["max_len"], int) or p["max_len"] <= 0):
        raise BadParam("max_len must be a positive integer")
    _keep_first(p)
    return p


def _history_check(p: dict[str, Any], types: list[ColType]) -> ColType:
    if len(types) != 3:
        raise Mismatch(f"history takes three inputs (values, their timestamps, the row's timestamp), "
                       f"got {len(types)}")
    v, t, ts = types
    if not is_list(v.kind):
        raise Mismatch(f"history needs a jagged values column as input 0, got {v.kind}")
    if t.kind not in (LIST_INT, LIST_FLOAT):
        raise Mismatch(f"history needs a jagged numeric timestamps column as input 1, got {t.kind}")
    if ts.kind not in (INT, FLOAT):
        raise Mismatch(f"history needs a scalar numeric timestamp column as input 2, got {ts.kind}")
    return v


def _history_apply(p: dict[str, Any], cols: list[Column], state: Any) -> Column:
    v, t, ts = cols
    if not np.array_equal(v.lengths, t.lengths):
        raise DataError("history: the values and timestamps columns have different list lengths")
    as_float = t.kind == LIST_FLOAT or ts.kind == FLOAT or isinstance(p["window_s"], float)
    dt = np.float64 if as_float else np.int64
    window = dt(p["window_s"])
    idx, lengths = K.history_index(v.lengths, t.values.astype(dt), ts.values.astype(dt),
                                   ts.present_mask(), window, int(p.get("max_len") or 0),
                                   _keep_first(p))
    return _gather(v, idx, lengths)


TRUNCATE = TransformDef(
    "truncate", {"max_len": Param((int,), required=True), "pad": Param((bool,), default=False),
                 "pad_value": Param(NUM, default=0), "keep": Param((str,), default="last")},
    _truncate_check, _truncate_apply, normalize=_truncate_norm)
HISTORY = TransformDef(
    "history", {"window_s": Param(NUM, required=True), "max_len": Param((int,)),
                "keep": Param((str,), default="last")},
    _history_check, _history_apply, multi_input=True, normalize=_history_norm)
