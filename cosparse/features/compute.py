"""Computing features over a RawBatch: a feature's transform chain applied to its input columns,
and a plan of features (in topological order) computed each exactly once. Used by the extractor
and by quantile fitting alike."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cosparse.data.errors import DataError
from cosparse.features.feature_spec import FeatureSpec
from cosparse.features.transforms import TRANSFORMS
from cosparse.features.types import Column, RawBatch


def prepare_states(f: FeatureSpec) -> list[Any]:
    """The per-process state of each transform of ``f`` (``TransformDef.prepare``; None if none)."""
    return [TRANSFORMS[t.op].prepare(t.params) if TRANSFORMS[t.op].prepare else None
            for t in f.transforms]


def apply_steps(f: FeatureSpec, cols: list[Column], states: list[Any], upto: int | None = None
                ) -> Column:
    """``f``'s transforms (the first ``upto`` of them) applied to its input columns ``cols``."""
    steps = f.transforms if upto is None else f.transforms[:upto]
    for t, st in zip(steps, states, strict=False):
        try:
            cols = [TRANSFORMS[t.op].apply(t.params, cols, st)]
        except DataError as e:
            raise DataError(f"feature '{f.name}': {e}") from None
    return cols[0]


def compute_plan(features: Mapping[str, FeatureSpec], plan: Sequence[str],
                 raw_columns: Sequence[str], states: Mapping[str, list[Any]], raw: RawBatch
                 ) -> dict[str, Column]:
    """Every feature of ``plan`` (topological order) over ``raw``, each once: name -> Column.

    ``raw_columns``: the raw columns the plan reads (a missing one is a DataError); ``states``:
    ``prepare_states`` of each feature of the plan."""
    missing = [c for c in raw_columns if c not in raw.columns]
    if missing:
        raise DataError(f"{raw.source}batch {raw.index}: raw batch lacks column '{missing[0]}'")
    done: dict[str, Column] = {}
    for n in plan:
        f = features[n]
        ins = [done[i] if i in features else raw.columns[i] for i in f.inputs]
        done[n] = apply_steps(f, ins, states[n])
    return done
