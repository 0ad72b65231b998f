"""Transforms whose output is IDs: ``hash``, ``bucketize`` (and fitting its quantiles), ``cross``
and ``vocab``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cosparse.data.errors import DataError
from cosparse.features import kernels as K
from cosparse.features.transforms.base import (
    NUM,
    BadParam,
    Mismatch,
    Param,
    TransformDef,
    buckets_of,
    check_numeric,
    one_input,
)
from cosparse.features.types import (
    FLOAT,
    INT,
    LIST_INT,
    STRING,
    STRING_KINDS,
    ColType,
    Column,
    element_kind,
    is_list,
)


# --- hash ----------------------------------------------------------------------------------------
def _hash_norm(p: dict[str, Any], base: Path | None) -> dict[str, Any]:
    if p.get("buckets") is not None and int(p["buckets"]) <= 0:
        raise BadParam("buckets must be a positive integer")
    return p


def _hash_check(p: dict[str, Any], types: list[ColType]) -> ColType:
    t = one_input(types, "hash")
    if element_kind(t.kind) == FLOAT:
        raise Mismatch(f"hash needs int or string values, got {t.kind} (bucketize floats first)")
    return ColType(LIST_INT if is_list(t.kind) else INT, True)


def _hash_apply(p: dict[str, Any], cols: list[Column], state: Any) -> Column:
    c = cols[0]
    seed, buckets = int(p["seed"]), buckets_of(p)
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
        if not isinstance(b, list) or not b or not all(isinstance(x, NUM) and not isinstance(x, bool)
                                                       for x in b):
            raise BadParam("boundaries must be a non-empty list of numbers")
        if any(b[i] >= b[i + 1] for i in range(len(b) - 1)):
            raise BadParam("boundaries must be strictly increasing")
        p = {**p, "boundaries": [float(x) for x in b]}
    return p


def _bucketize_check(p: dict[str, Any], types: list[ColType]) -> ColType:
    t = one_input(types, "bucketize")
    check_numeric(t, "bucketize")
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
    v = K.hash_cross(ids, int(p["seed"]), buckets_of(p))
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
    t = one_input(types, "vocab")
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


HASH = TransformDef(
    "hash", {"seed": Param((int,), default=0), "buckets": Param((int,))},
    _hash_check, _hash_apply, normalize=_hash_norm)
BUCKETIZE = TransformDef(
    "bucketize", {"boundaries": Param((list,)), "quantiles": Param((int,))},
    _bucketize_check, _bucketize_apply, normalize=_bucketize_norm,
    prepare=lambda p: None if p.get("boundaries") is None else np.array(p["boundaries"]))
CROSS = TransformDef("cross", {"seed": Param((int,), default=0), "buckets": Param((int,))},
                     _cross_check, _cross_apply, multi_input=True, normalize=_hash_norm)
VOCAB = TransformDef("vocab", {"values": Param((list,)), "file": Param((str,))},
                     _vocab_check, _vocab_apply, normalize=_vocab_norm, prepare=_vocab_prepare)
