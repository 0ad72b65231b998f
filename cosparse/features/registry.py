"""The feature registry's consumers: models that declare the features they use, optionally pinned
to a version (``name@version``), and their resolution against the versions a spec now produces."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cosparse.features.types import FeatureSpecError


@dataclass(frozen=True)
class FeatureRef:
    """One consumed feature: its name and the pinned version (None: whatever is current)."""

    name: str
    version: str | None = None

    def __str__(self) -> str:
        return self.name if self.version is None else f"{self.name}@{self.version}"


@dataclass(frozen=True)
class Consumer:
    """A model of the registry and the features it consumes, in order."""

    name: str
    consumes: tuple[FeatureRef, ...]


def parse_consumers(models: Any) -> dict[str, Consumer]:
    """The ``models:`` list of a spec -> name -> Consumer (shape errors are FeatureSpecError)."""
    if models is None:
        return {}
    if not isinstance(models, list):
        raise FeatureSpecError("models: must be a list of {name, consumes}")
    out: dict[str, Consumer] = {}
    for i, m in enumerate(models):
        where = f"models[{i}]"
        if not isinstance(m, dict):
            raise FeatureSpecError(f"{where}: must be a mapping with name and consumes")
        unknown = sorted(set(m) - {"name", "consumes"})
        if unknown:
            raise FeatureSpecError(f"{where}: unknown key '{unknown[0]}' (known: name, consumes)")
        name = m.get("name")
        if not isinstance(name, str) or not name:
            raise FeatureSpecError(f"{where}.name: must be a non-empty string")
        where = f"model '{name}'"
        if name in out:
            raise FeatureSpecError(f"{where}: declared twice")
        cons = m.get("consumes")
        if not isinstance(cons, list) or not cons:
            raise FeatureSpecError(f"{where}.consumes: must be a non-empty list of feature names")
        refs = []
        for j, c in enumerate(cons):
            if not isinstance(c, str) or not c or c.count("@") > 1:
                raise FeatureSpecError(f"{where}.consumes[{j}]: {c!r} is not 'name' or 'name@version'")
            n, _, v = c.partition("@")
            if not n or (c.count("@") == 1 and not v):
                raise FeatureSpecError(f"{where}.consumes[{j}]: {c!r} is not 'name' or 'name@version'")
            refs.append(FeatureRef(n, v or None))
        names = [r.name for r in refs]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise FeatureSpecError(f"{where}.consumes: feature '{dup}' listed twice")
        out[name] = Consumer(name, tuple(refs))
    return out


def resolve(consumer: Consumer, versions: Mapping[str, str]) -> list[str]:
    """The consumer's feature names, checked against ``versions`` (feature -> current version).

    An unknown feature, or a pinned version that differs from the current one, is a
    FeatureSpecError naming the model, the feature, the wanted and the current version.
    """
    out = []
    for r in consumer.consumes:
        cur = versions.get(r.name)
        if cur is None:
            raise FeatureSpecError(f"model '{consumer.name}': consumes unknown feature '{r.name}'")
        if r.version is not None and r.version != cur:
            raise FeatureSpecError(
                f"model '{consumer.name}': feature '{r.name}' is pinned to version {r.version} but the "
                f"spec now produces {cur} (update the pin to {r.name}@{cur} or restore the old spec)")
        out.append(r.name)
    return out


def stale_pins(consumer: Consumer, versions: Mapping[str, str]) -> list[tuple[str, str, str | None]]:
    """(feature, wanted, current or None) for each pin of ``consumer`` that does not resolve."""
    return [(r.name, r.version, versions.get(r.name)) for r in consumer.consumes
            if r.version is not None and versions.get(r.name) != r.version]
