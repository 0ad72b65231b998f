"""Feature specs from YAML: parsing and validation into a ``FeatureSet`` (the DAG, versions, types,
the registry of consuming models). Every problem is a FeatureSpecError naming the feature and the key,
raised when the spec is loaded or checked against a source, never mid-run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cosparse.features import graph
from cosparse.features.registry import Consumer, parse_consumers, resolve, stale_pins
from cosparse.features.transforms import TRANSFORMS, BadParam, Mismatch
from cosparse.features.types import (
    DENSE,
    FLOAT,
    INT,
    KINDS,
    LIST_INT,
    OUTPUT_KINDS,
    SEQUENCE,
    SPARSE,
    ColType,
    FeatureSpecError,
)

_FEATURE_KEYS = ("name", "inputs", "transforms", "kind", "table", "description")
_TOP_KEYS = ("features", "models", "raw")


@dataclass(frozen=True)
class TransformSpec:
    """One step of a feature: the transform's name and its normalised parameters."""

    op: str
    params: dict[str, Any]

    def canonical(self) -> list[Any]:
        return [self.op, {k: self.params[k] for k in sorted(self.params)}]


@dataclass(frozen=True)
class FeatureSpec:
    """One feature: inputs (raw columns or features), transforms, output kind and table."""

    name: str
    inputs: tuple[str, ...]
    transforms: tuple[TransformSpec, ...]
    kind: str
    table: str | None = None
    description: str = ""

    def canonical(self, input_versions: Sequence[str]) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "table": self.table,
                "transforms": [t.canonical() for t in self.transforms],
                "inputs": list(input_versions)}

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "inputs": list(self.inputs),
                             "transforms": [{t.op: dict(t.params)} for t in self.transforms],
                             "kind": self.kind}
        if self.table is not None:
            d["table"] = self.table
        if self.description:
            d["description"] = self.description
        return d


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


# --- type checking -----------------------------------------------------------------------------
def _output_check(f: FeatureSpec, t: ColType) -> None:
    where = f"feature '{f.name}'.kind"
    if f.kind == DENSE:
        if t.categorical:
            raise FeatureSpecError(f"{where}: declared dense but its values are IDs (the output of "
                                   f"hash/cross/vocab/bucketize); declare it sparse")
        if t.kind not in (INT, FLOAT):
            raise FeatureSpecError(f"{where}: declared dense but its values are {t.kind} "
                                   f"(dense needs one number per row)")
    elif f.kind == SPARSE:
        if t.kind not in (INT, LIST_INT):
            hint = " (hash or vocab it first)" if "string" in t.kind else \
                " (bucketize it first)" if "float" in t.kind else ""
            raise FeatureSpecError(f"{where}: declared sparse but its values are {t.kind}{hint}")
    elif f.kind == SEQUENCE and t.kind != LIST_INT:
        raise FeatureSpecError(f"{where}: declared sequence but its values are {t.kind} "
                               f"(a sequence needs a list of int IDs)")


def chain_types(f: FeatureSpec, in_types: list[ColType]) -> list[ColType]:
    """The type after each transform of ``f`` (a Mismatch is a FeatureSpecError naming the step)."""
    types = list(in_types)
    out = []
    for j, t in enumerate(f.transforms):
        tdef = TRANSFORMS[t.op]
        if j > 0 and tdef.multi_input:
            raise FeatureSpecError(f"feature '{f.name}': transforms[{j}].{t.op}: combines the "
                                   f"feature's inputs, so it must be the first transform")
        try:
            types = [tdef.check(t.params, types)]
        except Mismatch as e:
            msg = str(e).removeprefix(f"{t.op} ")
            raise FeatureSpecError(f"feature '{f.name}': transforms[{j}].{t.op}: {msg}") from None
        out.append(types[0])
    if not f.transforms and len(types) != 1:
        raise FeatureSpecError(f"feature '{f.name}'.inputs: {len(types)} inputs need a combining "
                               f"transform (cross or history)")
    return out


# --- the feature set ---------------------------------------------------------------------------
class FeatureSet:
    """A validated feature spec: features in topological order, versions, consumers."""

    def __init__(
        self,
        features: Sequence[FeatureSpec],
        consumers: Mapping[str, Consumer] | None = None,
        raw: Mapping[str, str] | None = None,
        check_pins: bool = True,
        source_name: str = "<spec>",
    ) -> None:
        self.source_name = source_name
        self.features: dict[str, FeatureSpec] = {}
        for f in features:
            if f.name in self.features:
                raise FeatureSpecError(f"feature '{f.name}': declared twice")
            self.features[f.name] = f
        self.raw: dict[str, str] | None = None if raw is None else dict(raw)
        if self.raw is not None:
            for n in self.features:
                if n in self.raw:
                    raise FeatureSpecError(f"feature '{n}': has the name of a raw column")
        self.consumers: dict[str, Consumer] = dict(consumers or {})
        self.deps: dict[str, tuple[str, ...]] = {n: f.inputs for n, f in self.features.items()}
        self.order: list[str] = graph.topo_order(self.deps)
        self.downstream: dict[str, list[str]] = graph.downstream(self.deps)
        self.types: dict[str, ColType] | None = None
        self.raw_types: dict[str, str] | None = None
        if self.raw is not None:
            self._check(self.raw, "raw")
        self.versions: dict[str, str] = {}
        for n in self.order:
            f = self.features[n]
            ins = [self.versions[i] if i in self.features else self.raw_version(i) for i in f.inputs]
            self.versions[n] = graph.digest(f.canonical(ins))
        if check_pins:
            for c in self.consumers.values():
                resolve(c, self.versions)

    # --- validation ----------------------------------------------------------------------------
    def raw_version(self, column: str) -> str:
        return graph.raw_version(column, None if self.raw is None else self.raw.get(column))

    def raw_inputs(self, names: Sequence[str] | None = None) -> list[str]:
        """Raw columns that ``names`` (default: every feature) read, in first-use order."""
        want = self.features if names is None else self.closure(names)
        out: list[str] = []
        for n in self.order:
            if n in want:
                out.extend(i for i in self.features[n].inputs if i not in self.features and i not in out)
        return out

    def _check(self, columns: Mapping[str, str], what: str) -> dict[str, ColType]:
        types: dict[str, ColType] = {}
        for n in self.order:
            f = self.features[n]
            in_types = []
            for i in f.inputs:
                if i in self.features:
                    in_types.append(types[i])
                elif i in columns:
                    in_types.append(ColType(columns[i]))
                else:
                    near = ", ".join(sorted(columns)[:8]) + (", ..." if len(columns) > 8 else "")
                    raise FeatureSpecError(
                        f"feature '{n}'.inputs: unknown input '{i}': not a feature and not a "
                        f"column of the {what} ({near})")
            steps = chain_types(f, in_types)
            t = steps[-1] if steps else in_types[0]
            _output_check(f, t)
            types[n] = t
        self.types, self.raw_types = types, dict(columns)
        return types

    def check_source(self, columns: Mapping[str, str]) -> dict[str, ColType]:
        """Check the spec against a source's columns (name -> kind): every raw input exists, its
        kind matches a declared ``raw:`` kind, and every transform accepts its input types."""
        for n in self.features:
            if n in columns:
                raise FeatureSpecError(f"feature '{n}': has the name of a column of the source")
        if self.raw is not None:
            for c, k in self.raw.items():
                if c in columns and columns[c] != k:
                    raise FeatureSpecError(f"raw.{c}: declared {k} but the source has {columns[c]}")
        return self._check(columns, "source")

    # --- queries -------------------------------------------------------------------------------
    def __contains__(self, name: str) -> bool:
        return name in self.features

    def __getitem__(self, name: str) -> FeatureSpec:
        try:
            return self.features[name]
        except KeyError:
            raise FeatureSpecError(f"unknown feature '{name}'") from None

    def version(self, name: str) -> str:
        self[name]
        return self.versions[name]

    def closure(self, names: Sequence[str]) -> list[str]:
        """``names`` and everything they depend on, in topological order."""
        for n in names:
            self[n]
        want = graph.closure(self.deps, list(names))
        return [n for n in self.order if n in want]

    def consumer(self, model: str) -> list[FeatureSpec]:
        """The features a model consumes, resolved against current versions (stale pin: error)."""
        c = self.consumers.get(model)
        if c is None:
            known = ", ".join(self.consumers) or "none"
            raise FeatureSpecError(f"unknown model '{model}' (models of the spec: {known})")
        return [self.features[n] for n in resolve(c, self.versions)]

    def consumer_keys(self, model: str) -> tuple[list[str], list[str]]:
        """(sparse and sequence feature names, dense feature names) of a model, in its order."""
        feats = self.consumer(model)
        return [f.name for f in feats if f.kind != DENSE], [f.name for f in feats if f.kind == DENSE]

    def stale_pins(self) -> dict[str, list[tuple[str, str, str | None]]]:
        """model -> [(feature, pinned, current)] for every pin that no longer resolves."""
        out = {m: stale_pins(c, self.versions) for m, c in self.consumers.items()}
        return {m: s for m, s in out.items() if s}

    # --- quantile fitting ----------------------------------------------------------------------
    def unfitted(self, names: Sequence[str] | None = None) -> list[tuple[str, int]]:
        """(feature, transform index) of each bucketize with quantiles but no boundaries."""
        names = list(self.features) if names is None else self.closure(names)
        return [(n, j) for n in names for j, t in enumerate(self.features[n].transforms)
                if t.op == "bucketize" and t.params.get("boundaries") is None]

    def fitted(self) -> dict[str, dict[int, list[float]]]:
        """feature -> {transform index: boundaries} of every quantile bucketize that is fitted."""
        out: dict[str, dict[int, list[float]]] = {}
        for n, f in self.features.items():
            for j, t in enumerate(f.transforms):
                if t.op == "bucketize" and t.params.get("quantiles") and t.params.get("boundaries"):
                    out.setdefault(n, {})[j] = list(t.params["boundaries"])
        return out

    def with_fitted(self, fitted: Mapping[str, Mapping[int, Sequence[float]]]) -> FeatureSet:
        """A copy whose unfitted quantile bucketizes take the given boundaries (others unchanged)."""
        feats = []
        for n, f in self.features.items():
            steps = list(f.transforms)
            for j, b in (fitted.get(n) or {}).items():
                j = int(j)
                if j < len(steps) and steps[j].op == "bucketize" and steps[j].params.get("quantiles") \
                        and steps[j].params.get("boundaries") is None:
                    steps[j] = TransformSpec("bucketize", {**steps[j].params,
                                                           "boundaries": [float(x) for x in b]})
            feats.append(dataclasses.replace(f, transforms=tuple(steps)))
        return FeatureSet(feats, self.consumers, self.raw, check_pins=False, source_name=self.source_name)

    def fit(self, raw: Any) -> FeatureSet:
        """Fit every unfitted quantile bucketize on the RawBatch ``raw`` (a sample)."""
        from cosparse.features.extract import fit_feature_set

        return fit_feature_set(self, raw)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"features": [self.features[n].to_dict() for n in self.features]}
        if self.raw is not None:
            d["raw"] = dict(self.raw)
        if self.consumers:
            d["models"] = [{"name": c.name, "consumes": [str(r) for r in c.consumes]}
                           for c in self.consumers.values()]
        return d


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
