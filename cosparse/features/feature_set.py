"""A validated feature spec: the ``FeatureSet``, its DAG in topological order, the version of
every feature (a hash of its definition and its inputs' versions), the types checked against a
source, the models that consume it, and the fitting of its quantile buckets on a sample.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from cosparse.features import graph
from cosparse.features.compute import apply_steps, compute_plan, prepare_states
from cosparse.features.feature_spec import FeatureSpec, TransformSpec
from cosparse.features.registry import Consumer, resolve, stale_pins
from cosparse.features.transforms import fit_quantiles
from cosparse.features.typecheck import chain_types, output_check
from cosparse.features.types import DENSE, ColType, Column, FeatureSpecError, RawBatch


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
            output_check(f, t)
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

    def check_fitted(self, outputs: Sequence[str]) -> None:
        """Raise unless every quantile bucketize that ``outputs`` depend on is fitted."""
        unfitted = self.unfitted(outputs)
        if unfitted:
            n, j = unfitted[0]
            raise FeatureSpecError(f"feature '{n}': transforms[{j}].bucketize: quantiles are not "
                                   f"fitted (FeatureSet.fit on a sample, or give boundaries)")

    def fit(self, raw: RawBatch) -> FeatureSet:
        """Fit every unfitted quantile bucketize on the RawBatch ``raw`` (a sample), in topological
        order, so a fitted feature may feed another; returns the fitted copy."""
        fs = self
        for n in fs.order:
            todo = [j for (m, j) in fs.unfitted([n]) if m == n]
            if not todo:
                continue
            f = fs.features[n]
            deps = [i for i in f.inputs if i in fs.features]
            done = fs._compute(deps, raw) if deps else {}
            ins = [done[i] if i in fs.features else raw.columns[i] for i in f.inputs]
            fitted: dict[int, list[float]] = {}
            for j in todo:
                states = prepare_states(f)[:j]
                col = apply_steps(f, ins, states, upto=j) if j > 0 else ins[0]
                fitted[j] = fit_quantiles(col, int(f.transforms[j].params["quantiles"]))
                fs = fs.with_fitted({n: fitted})
                f = fs.features[n]
        return fs

    def _compute(self, outputs: Sequence[str], raw: RawBatch) -> dict[str, Column]:
        """``outputs`` and what they depend on over ``raw`` (as a ``FeatureExtractor`` would)."""
        outputs = list(dict.fromkeys(outputs))
        plan = self.closure(outputs)
        self.check_fitted(outputs)
        states = {n: prepare_states(self.features[n]) for n in plan}
        return compute_plan(self.features, plan, self.raw_inputs(outputs), states, raw)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"features": [self.features[n].to_dict() for n in self.features]}
        if self.raw is not None:
            d["raw"] = dict(self.raw)
        if self.consumers:
            d["models"] = [{"name": c.name, "consumes": [str(r) for r in c.consumes]}
                           for c in self.consumers.values()]
        return d
