"""Fitting quantile buckets once, into the spec: ``cosparse features fit``.

A ``bucketize`` with ``quantiles: N`` takes its boundaries from data. They are part of the
feature's version, so they are fitted once, on a declared sample, and written into a fitted spec
that training and materialization then read. Fitting at every start instead would give a
feature whose meaning (and version) depends on the batch that happened to come first, which is
exactly the drift the registry is there to prevent; an unfitted spec is therefore refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import yaml

from cosparse.features.feature_set import FeatureSet
from cosparse.features.sources import open_source
from cosparse.features.spec import load_spec
from cosparse.features.types import FeatureSpecError


def require_fitted(fs: FeatureSet, spec_path: str | Path, names: Sequence[str] | None = None
                   ) -> None:
    """Raise naming the features whose quantile buckets are not fitted, and the command."""
    todo = sorted({n for n, _ in fs.unfitted(names)})
    if todo:
        raise FeatureSpecError(
            f"feature '{todo[0]}' buckets by quantiles that are not fitted"
            + (f" (nor are {', '.join(todo[1:])})" if len(todo) > 1 else "")
            + f": run `cosparse features fit --spec {spec_path} --data DATA --out FITTED.yaml` "
            "and use the fitted spec (its boundaries are part of the versions)")


def fit_spec_file(spec: str | Path, data: str | Path, out: str | Path, rows: int = 100_000,
                  eval_fraction: float = 0.2, on_bad_record: str = "fail",
                  source: str | None = None) -> dict[str, dict[int, list[float]]]:
    """Fit every quantile bucketize of ``spec`` on the first ``rows`` rows of the training split
    of ``data`` and write the fitted spec to ``out``; returns the fitted boundaries."""
    if rows <= 0:
        raise ValueError("--rows: must be positive")
    fs = load_spec(spec, check_pins=False)
    sample_source = open_source(data, rows, "train", eval_fraction, on_bad_record, source)
    fs.check_source(sample_source.columns)
    first = next(iter(sample_source.tasks()), None)
    if first is None:
        raise ValueError(f"--data: {data} has no training rows to fit on")
    fitted = fs.fit(sample_source.build_raw(first))
    header = (f"# fitted by `cosparse features fit` from {spec}: quantile boundaries of the first "
              f"{rows} training rows of {data}\n")
    Path(out).write_text(header + yaml.safe_dump(fitted.to_dict(), sort_keys=False))
    return fitted.fitted()
