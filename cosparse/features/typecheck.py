"""Static type checking of a feature: the type after each of its transforms, and whether its
output fits its declared kind. Every problem is a FeatureSpecError naming the feature and step."""

from __future__ import annotations

from cosparse.features.feature_spec import FeatureSpec
from cosparse.features.transforms import TRANSFORMS, Mismatch
from cosparse.features.types import (
    DENSE,
    FLOAT,
    INT,
    LIST_INT,
    SEQUENCE,
    SPARSE,
    ColType,
    FeatureSpecError,
)


def output_check(f: FeatureSpec, t: ColType) -> None:
    """Raise unless a feature's final type ``t`` fits its declared kind (dense, sparse, sequence)."""
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
