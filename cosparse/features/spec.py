"""Feature specs from YAML: parsing and validation into a ``FeatureSet`` (the DAG, versions, types,
the registry of consuming models). Every problem is a FeatureSpecError naming the feature and the key,
raised when the spec is loaded or checked against a source, never mid-run.

This module parses; the parsed parts are ``feature_spec`` (one feature), ``feature_set`` (the
validated whole) and ``typecheck`` (types through the transforms), re-exported here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from cosparse.features.feature_set import FeatureSet
from cosparse.features.feature_spec import FeatureSpec, TransformSpec
from cosparse.features.registry import parse_consumers
from cosparse.features.transforms import TRANSFORMS, BadParam
from cosparse.features.typecheck import chain_types
from cosparse.features.types import DENSE, KINDS, OUTPUT_KINDS, FeatureSpecError

__all__ = ["FeatureSet", "FeatureSpec", "TransformSpec", "chain_types", "load_spec", "parse_spec"]

_FEATURE_KEYS = ("name", "inputs", "transforms", "kind", "table", "description")
_TOP_KEYS = ("features", "models", "raw")


# --- parsing ---------------------------------------------------------------------------------------
def _parse_params(fname: str, i: int, op: str, raw: Any, base: Path | None) -> dict[str, Any]:
    where = f"feature '{fname}': transforms[{i}].{op}"
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise FeatureSpecError(f"{where}: parameters must be a mapping, got {raw!r}")
    tdef = TRANSFORMS[op]
    unknown = sorted(set(raw) - set(tdef.params))
    if unknown:
        known = ", ".join(tdef.params) or "none"
        raise FeatureSpecError(f"{where}: unknown parameter '{unknown[0]}' (known: {known})")
    params: dict[str, Any] = {}
    for key, p in tdef.params.items():
        if key not in raw or raw[key] is None:
            if p.required:
                raise FeatureSpecError(f"{where}.{key}: required parameter is missing")
            if p.default is not None:
                params[key] = p.default
            continue
        v = raw[key]
        if (isinstance(v, bool) and bool not in p.types) or not isinstance(v, p.types):
            names = " or ".join(t.__name__ for t in p.types)
            raise FeatureSpecError(f"{where}.{key}: must be {names}, got {v!r}")
        params[key] = v
    if tdef.normalize is not None:
        try:
            params = tdef.normalize(params, base)
        except BadParam as e:
            raise FeatureSpecError(f"{where}: {e}") from None
    return params


def _parse_feature(i: int, d: Any, base: Path | None) -> FeatureSpec:
    if not isinstance(d, dict):
        raise FeatureSpecError(f"features[{i}]: must be a mapping with name, inputs, transforms, kind")
    name = d.get("name")
    if not isinstance(name, str) or not name or "@" in name:
        raise FeatureSpecError(f"features[{i}].name: must be a non-empty string without '@', "
                               f"got {name!r}")
    where = f"feature '{name}'"
    unknown = sorted(set(d) - set(_FEATURE_KEYS))
    if unknown:
        raise FeatureSpecError(f"{where}: unknown key '{unknown[0]}' (known: {', '.join(_FEATURE_KEYS)})")
    inputs = d.get("inputs")
    if isinstance(inputs, str):
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs or not all(isinstance(x, str) and x for x in inputs):
        raise FeatureSpecError(f"{where}.inputs: must be a non-empty list of column or feature names")
    if name in inputs:
        raise FeatureSpecError(f"{where}.inputs: a feature cannot be its own input (cycle: {name} -> "
                               f"{name}); a feature may not share a raw column's name either")
    kind = d.get("kind")
    if kind not in OUTPUT_KINDS:
        raise FeatureSpecError(f"{where}.kind: must be one of {', '.join(OUTPUT_KINDS)}, got {kind!r}")
    table = d.get("table")
    if kind == DENSE and table is not None:
        raise FeatureSpecError(f"{where}.table: a dense feature has no embedding table")
    if table is not None and (not isinstance(table, str) or not table):
        raise FeatureSpecError(f"{where}.table: must be a non-empty string")
    if kind != DENSE and table is None:
        table = name
    tr = d.get("transforms") or []
    if not isinstance(tr, list):
        raise FeatureSpecError(f"{where}.transforms: must be a list of {{name: {{params}}}}")
    steps = []
    for j, t in enumerate(tr):
        if isinstance(t, str):
            t = {t: {}}
        if not isinstance(t, dict) or len(t) != 1:
            raise FeatureSpecError(f"{where}: transforms[{j}]: must be one {{name: {{params}}}} "
                                   f"mapping, got {t!r}")
        (op, raw), = t.items()
        if op not in TRANSFORMS:
            raise FeatureSpecError(f"{where}: transforms[{j}]: unknown transform '{op}' "
                                   f"(known: {', '.join(TRANSFORMS)})")
        steps.append(TransformSpec(op, _parse_params(name, j, op, raw, base)))
    desc = d.get("description") or ""
    return FeatureSpec(name, tuple(inputs), tuple(steps), kind, table, str(desc))


def _parse_raw(raw: Any) -> dict[str, str] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise FeatureSpecError("raw: must map column names to kinds")
    for k, v in raw.items():
        if v not in KINDS:
            raise FeatureSpecError(f"raw.{k}: unknown column kind {v!r} (known: {', '.join(KINDS)})")
    return {str(k): str(v) for k, v in raw.items()}


def parse_spec(doc: Any, base_dir: Path | None = None, check_pins: bool = True,
               source_name: str = "<spec>") -> FeatureSet:
    """A FeatureSet from a parsed YAML document (a mapping with ``features`` and ``models``)."""
    if not isinstance(doc, dict):
        raise FeatureSpecError(f"{source_name}: a feature spec is a mapping with 'features' and 'models'")
    unknown = sorted(set(doc) - set(_TOP_KEYS))
    if unknown:
        raise FeatureSpecError(f"{source_name}: unknown key '{unknown[0]}' (known: {', '.join(_TOP_KEYS)})")
    feats = doc.get("features")
    if not isinstance(feats, list) or not feats:
        raise FeatureSpecError(f"{source_name}: 'features' must be a non-empty list")
    specs = [_parse_feature(i, d, base_dir) for i, d in enumerate(feats)]
    return FeatureSet(specs, parse_consumers(doc.get("models")), _parse_raw(doc.get("raw")),
                      check_pins=check_pins, source_name=source_name)


def load_spec(path: str | Path, check_pins: bool = True) -> FeatureSet:
    """Load and validate a YAML feature spec. Relative vocabulary files resolve beside it."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise FeatureSpecError(f"{p}: cannot read the feature spec ({e.strerror})") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise FeatureSpecError(f"{p}: not valid YAML ({e})") from None
    try:
        return parse_spec(doc, p.parent, check_pins, str(p))
    except FeatureSpecError as e:
        msg = str(e)
        raise FeatureSpecError(msg if msg.startswith(str(p)) else f"{p}: {msg}") from None
