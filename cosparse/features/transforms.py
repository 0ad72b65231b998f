"""The transforms of a feature spec: their parameters, static type rules and vectorised kernels.

Each transform is a ``TransformDef``: ``params`` (name -> Param), ``check`` (input types -> output
type, or ``Mismatch``), ``prepare`` (params -> per-process state, once) and ``apply`` (columns ->
column, for a whole batch: numpy, pyarrow compute or numba; never a per-row Python loop).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cosparse.data.errors import DataError
from cosparse.features import kernels as K
from cosparse.features.types import (
    FLOAT,
    INT,
    LIST_FLOAT,
    LIST_INT,
    LIST_STRING,
    STRING,
    STRING_KINDS,
    ColType,
    Column,
    element_kind,
    is_list,
    list_of,
)


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


_NUM = (int, float)


def _one(types: list[ColType], op: str) -> ColType:
    if len(types) != 1:
        raise Mismatch(f"{op} takes one input column, got {len(types)} (use cross or history to "
                       f"combine columns)")
    return types[0]


def _numeric(t: ColType, op: str, allow_lists: bool = True) -> None:
    ek = element_kind(t.kind)
    if ek == STRING:
        raise Mismatch(f"{op} needs a numeric column, got {t.kind}")
    if is_list(t.kind) and not allow_lists:
        raise Mismatch(f"{op} needs a scalar column, got {t.kind}")
    if t.categorical:
        raise Mismatch(f"{op} needs numeric values, got IDs (the output of hash/cross/vocab/"
                       f"bucketize)")


def _like(col: Column, kind: str, values: np.ndarray, present: np.ndarray | None = "same",  # type: ignore
          categorical: bool | None = None) -> Column:
    return Column(kind, values, col.present if isinstance(present, str) else present, col.lengths,
                  None, col.categorical if categorical is None else categorical)


def _fill_params(params: dict[str, Any]) -> int:
    b = params.get("buckets")
    return 0 if b is None else int(b)


# --- hash ----------------------------------------------------------------------------------------
def _hash_norm(p: dict[str, Any], base: Path | None) -> dict[str, Any]:
    if p.get("buckets") is not None and int(p["buckets"]) <= 0:
        raise BadParam("buckets must be a positive integer")
    return p


def _hash_check(p: dict[str, Any], types: list[ColType]) -> ColType:
    t = _one(types, "hash")
    if element_kind(t.kind) == FLOAT:
        raise Mismatch(f"hash needs int or string values, got {t.kind} (bucketize floats first)")
    return ColType(LIST_INT if is_list(t.kind) else INT, True)


def _hash_apply(p: dict[str, Any], cols: list[Column], state: Any) -> Column:
    c = cols[0]
    seed, buckets = int(p["seed"]), _fill_params(p)
    if c.kind in STRING_KINDS:
        v = K.hash_strings(c.values, c.offsets, seed, buckets)
    else:
        v = K.hash_ints(c.values, seed, buckets)
    return Column(LIST_INT if is_list(c.kind) else INT, v, c.present, c.lengths, None, True)


# --- bucketize -----------------------------------------------------------------------------------
def _bucketize_norm(p: dict[str, Any], base: Path | None) -> dict[str, Any]:
    b, q = p.get("boundaries"), p.get("quantiles")
    if b is None and q is None:
        raise BadParam("give boundaries or quantiles")
    if q is not None and (not isinstance(q, int) or q < 2):
        raise BadParam("quantiles must be an integer >= 2")
    if b is not None:
        if not isinstance(b, list) or not b or not all(isinstance(x, _NUM) and not isinstance(x, bool)
                                                       for x in b):
            raise BadParam("boundaries must be a non-empty list of numbers")
        if any(b[i] >= b[i + 1] for i in range(len(b) - 1)):
            raise BadParam("boundaries must be strictly increasing")
        p = {**p, "boundaries": [float(x) for x in b]}
    return p


def _bucketize_check(p: dict[str, Any], types: list[ColType]) -> ColType:
    t = _one(types, "bucketize")
    _numeric(t, "bucketize")
    return ColType(LIST_INT if is_list(t.kind) else INT, True)


def _bucketize_apply(p: dict[str, Any], cols: list[Column], state: Any) -> Column:
    c = cols[0]
    if p.get("boundaries") is None:
        raise DataError("bucketize: quantile boundaries are not fitted (FeatureSet.fit)")
    v = np.searchsorted(state, c.values, side="right").astype(np.int64)
    return Column(LIST_INT if is_list(c.kind) else INT, v, c.present, c.lengths, None, True)


def fit_quantiles(col: Column, quantiles: int) -> list[float]:
    """Boundaries at the ``quantiles``-quantiles of the present values of ``col`` (deduplicated)."""
    vals = col.values if col.present is None or col.lengths is not None else col.values[col.present]
    if len(vals) == 0:
        raise DataError("bucketize: cannot fit quantiles on a sample without values")
    qs = np.quantile(vals.astype(np.float64), np.arange(1, quantiles) / quantiles)
    return [float(x) for x in np.unique(qs)]


# --- log1p, clip, fill_missing -------------------------------------------------------------------
def _log1p_check(p: dict[str, Any], types: list[ColType]) -> ColType:
    t = _one(types, "log1p")
    _numeric(t, "log1p")
    return ColType(LIST_FLOAT if is_list(t.kind) else FLOAT)


def _log1p_apply(p: dict[str, Any], cols: list[Column], state: Any) -> Column:
    c = cols[0]
    x = c.values.astype(np.float64)
    bad = x < -1.0
    if c.present is not None:
        bad &= np.repeat(c.present, c.lengths) if c.lengths is not None else c.present
    if bad.any():
        raise DataError(f"log1p: {int(bad.sum())} values below -1 (first {x[bad][0]!r}); clip first")
    return _like(c, LIST_FLOAT if is_list(c.kind) else FLOAT, np.log1p(x))


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
    t = _one(types, "clip")
    _numeric(t, "clip")
    return ColType(_clip_kind(p, t.kind))


def _clip_apply(p: dict[str, Any], cols: list[Column], state: Any) -> Column:
    c = cols[0]
    kind = _clip_kind(p, c.kind)
    x = c.values if element_kind(kind) == INT else c.values.astype(np.float64)
    return _like(c, kind, np.clip(x, p.get("min"), p.get("max")))


def _fill_check(p: dict[str, Any], types: list[ColType]) -> ColType:
    t = _one(types, "fill_missing")
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


# --- cross ---------------------------------------------------------------------------------------
def _cross_check(p: dict[str, Any], types: list[ColType]) -> ColType:
    if len(types) < 2:
        raise Mismatch(f"cross needs two or more inputs, got {len(types)}")
    for i, t in enumerate(types):
        if t.kind != INT:
            raise Mismatch(f"cross needs scalar int IDs, input {i} is {t.kind}"
                           + (" (hash it first)" if t.kind == STRING else ""))
    return ColType(INT, True)


def _cross_apply(p: dict[str, Any], cols: list[Column], state: Any) -> Column:
    ids = np.stack([c.values for c in cols])
    present = None
    for c in cols:
        if c.present is not None:
            present = c.present.copy() if present is None else present & c.present
    v = K.hash_cross(ids, int(p["seed"]), _fill_params(p))
    return Column(INT, v, present, None, None, True)


# --- vocab ---------------------------------------------------------------------------------------
def _vocab_norm(p: dict[str, Any], base: Path | None) -> dict[str, Any]:
    vals, file = p.get("values"), p.get("file")
    if (vals is None) == (file is None):
        raise BadParam("give exactly one of values or file")
    if file is not None:
        path = Path(file)
        if not path.is_absolute() and base is not None:
            path = base / path
        try:
            text = path.read_text()
        except OSError as e:
            raise BadParam(f"cannot read vocabulary file {str(path)!r} ({e.strerror})") from None
        vals = [line.strip() for line in text.splitlines() if line.strip()]
    if not isinstance(vals, list) or not vals:
        raise BadParam("the vocabulary is empty")
    if not all(isinstance(v, int | str) and not isinstance(v, bool) for v in vals):
        raise BadParam("vocabulary entries must be ints or strings")
    if len(set(vals)) != len(vals):
        raise BadParam("the vocabulary has duplicate entries")
    # the entries are what the version hashes; the file name is only where they came from
    return {"values": vals}


def _vocab_check(p: dict[str, Any], types: list[ColType]) -> ColType:
    t = _one(types, "vocab")
    ek = element_kind(t.kind)
    if ek == FLOAT:
        raise Mismatch(f"vocab needs int or string values, got {t.kind}")
    if ek == INT:
        try:
            [int(v) for v in p["values"]]
        except ValueError:
            raise Mismatch("vocab entries are not integers but the input is an int column") from None
    return ColType(LIST_INT if is_list(t.kind) else INT, True)


def _vocab_prepare(p: dict[str, Any]) -> Any:
    import pyarrow as pa

    vals = p["values"]
    ints = None
    try:
        arr = np.array([int(v) for v in vals], np.int64)
        order = np.argsort(arr, kind="stable")
        ints = (arr[order], order.astype(np.int64))
    except ValueError:
        pass
    return {"ints": ints, "strings": pa.array([str(v) for v in vals], pa.large_string())}


def _vocab_apply(p: dict[str, Any], cols: list[Column], state: Any) -> Column:
    import pyarrow as pa
    import pyarrow.compute as pc

    c = cols[0]
    oov = len(p["values"])
    if c.kind in STRING_KINDS:
        n = len(c.offsets) - 1  # type: ignore[arg-type]
        arr = pa.LargeStringArray.from_buffers(n, pa.py_buffer(c.offsets), pa.py_buffer(c.values))
        idx = pc.index_in(arr, value_set=state["strings"]).fill_null(oov)
        v = np.asarray(idx.to_numpy(zero_copy_only=False), np.int64)
    else:
        sorted_v, order = state["ints"]
        pos = np.minimum(np.searchsorted(sorted_v, c.values), len(sorted_v) - 1)
        v = np.where(sorted_v[pos] == c.values, order[pos], oov).astype(np.int64)
    return Column(LIST_INT if is_list(c.kind) else INT, v, c.present, c.lengths, None, True)


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
    t = _one(types, "truncate")
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


TRANSFORMS: dict[str, TransformDef] = {
    "hash": TransformDef(
        "hash", {"seed": Param((int,), default=0), "buckets": Param((int,))},
        _hash_check, _hash_apply, normalize=_hash_norm),
    "bucketize": TransformDef(
        "bucketize", {"boundaries": Param((list,)), "quantiles": Param((int,))},
        _bucketize_check, _bucketize_apply, normalize=_bucketize_norm,
        prepare=lambda p: None if p.get("boundaries") is None else np.array(p["boundaries"])),
    "log1p": TransformDef("log1p", {}, _log1p_check, _log1p_apply),
    "clip": TransformDef("clip", {"min": Param(_NUM), "max": Param(_NUM)}, _clip_check, _clip_apply,
                         normalize=_clip_norm),
    "fill_missing": TransformDef("fill_missing", {"value": Param(_NUM, required=True)},
                                 _fill_check, _fill_apply),
    "cross": TransformDef("cross", {"seed": Param((int,), default=0), "buckets": Param((int,))},
                          _cross_check, _cross_apply, multi_input=True, normalize=_hash_norm),
    "vocab": TransformDef("vocab", {"values": Param((list,)), "file": Param((str,))},
                          _vocab_check, _vocab_apply, normalize=_vocab_norm, prepare=_vocab_prepare),
    "truncate": TransformDef(
        "truncate", {"max_len": Param((int,), required=True), "pad": Param((bool,), default=False),
                     "pad_value": Param(_NUM, default=0), "keep": Param((str,), default="last")},
        _truncate_check, _truncate_apply, normalize=_truncate_norm),
    "history": TransformDef(
        "history", {"window_s": Param(_NUM, required=True), "max_len": Param((int,)),
                    "keep": Param((str,), default="last")},
        _history_check, _history_apply, multi_input=True, normalize=_history_norm),
}

__all__ = ["TRANSFORMS", "BadParam", "Mismatch", "Param", "TransformDef", "fit_quantiles", "list_of"]
