"""One feature of a spec as plain data: ``FeatureSpec`` (inputs, transforms, output kind, table)
and each of its steps, ``TransformSpec``, with the canonical forms their versions hash."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


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
