"""``cosparse features lineage|diff|fit|materialize``: the feature platform's specs.
"""

from __future__ import annotations

import argparse
import json


def _features_lineage(args: argparse.Namespace) -> int:
    from cosparse.features import format_lineage, lineage, load_spec

    def body() -> int:
        fs = load_spec(args.spec, check_pins=False)
        print(json.dumps(lineage(fs), indent=1) if args.json else format_lineage(fs))
        return 0

    return body()


def _features_diff(args: argparse.Namespace) -> int:
    from cosparse.features import diff, format_diff, load_spec

    def body() -> int:
        a, b = load_spec(args.a, check_pins=False), load_spec(args.b, check_pins=False)
        print(json.dumps(diff(a, b), indent=1) if args.json else format_diff(a, b))
        return 0

    return body()


def _features_materialize(args: argparse.Namespace) -> int:
    from cosparse.features import load_spec, materialize, open_source, require_fitted

    def body() -> int:
        fs = load_spec(args.spec)
        feats = [f for f in args.features.split(",") if f.strip()] if args.features else None
        src = open_source(args.data, args.batch_size, "train", 0.0, args.on_bad_record, args.source)
        require_fitted(fs, args.spec, feats)
        manifest = materialize(src, fs, args.out, feats, progress_every=args.progress_every)
        print(json.dumps({"out": args.out, "rows": manifest["rows"],
                          "bad_records": manifest["bad_records"],
                          "features": {n: f["version"] for n, f in manifest["features"].items()}},
                         sort_keys=True))
        return 0

    return body()


def _features_fit(args: argparse.Namespace) -> int:
    from cosparse.features import fit_spec_file

    def body() -> int:
        fitted = fit_spec_file(args.spec, args.data, args.out, args.rows, args.eval_fraction,
                               args.on_bad_record, args.source)
        print(json.dumps({"out": args.out, "fitted": fitted}, sort_keys=True))
        return 0

    return body()


def add_features_parser(sub: argparse._SubParsersAction) -> None:
    fp = sub.add_parser("features", help="feature platform: lineage, diff, fit, materialize")
    fps = fp.add_subparsers(dest="features_command", required=True)
    li = fps.add_parser("lineage", help="print the feature DAG with versions and consuming models")
    li.add_argument("--spec", required=True, help="YAML feature spec")
    li.add_argument("--json", action="store_true", help="print the structure as JSON")
    li.set_defaults(func=_features_lineage)
    d = fps.add_parser("diff", help="added / removed / changed features and the models affected")
    d.add_argument("a", help="old YAML feature spec")
    d.add_argument("b", help="new YAML feature spec")
    d.add_argument("--json", action="store_true", help="print the structure as JSON")
    d.set_defaults(func=_features_diff)
    m = fps.add_parser("materialize", help="extract features once and write them to Parquet, "
                                            "keyed by feature version")
    _add_spec_and_data(m)
    m.add_argument("--out", required=True, help="output directory (manifest.json + one file per feature)")
    m.add_argument("--features", default=None, help="comma-separated features (default: all)")
    m.add_argument("--batch-size", type=int, default=65536, help="rows per batch / row group")
    m.add_argument("--progress-every", type=int, default=10, help="a progress line per N batches")
    m.set_defaults(func=_features_materialize)
    f = fps.add_parser("fit", help="fit the spec's quantile buckets on a sample and write the "
                                   "fitted spec (its boundaries are part of the versions)")
    _add_spec_and_data(f)
    f.add_argument("--out", required=True, help="the fitted spec to write (YAML)")
    f.add_argument("--rows", type=int, default=100000,
                   help="fit on the first ROWS rows of the training split")
    f.add_argument("--eval-fraction", type=float, default=0.2,
                   help="the held-out tail the sample must not touch (as data.eval_fraction)")
    f.set_defaults(func=_features_fit)


def _add_spec_and_data(p: argparse.ArgumentParser) -> None:
    """The spec and the raw data a features command reads."""
    p.add_argument("--spec", required=True, help="YAML feature spec")
    p.add_argument("--data", required=True, help="Criteo TSV (.txt, .gz) or Parquet (.parquet) file")
    p.add_argument("--source", choices=["criteo", "parquet"], default=None,
                   help="source format (default: by extension)")
    p.add_argument("--on-bad-record", choices=["fail", "skip"], default="fail")
