"""``cosparse data describe|baseline``: a data file's columns before a config, and the AUC a
model must beat on the config's own split.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from cosparse.config import ColumnsConfig, load_config


def _data_describe(args: argparse.Namespace) -> int:
    """``cosparse data describe``: see ``cosparse.features.describe``."""
    from cosparse.features.csv_columns import NAME_OF_KIND
    from cosparse.features.describe import run_describe
    from cosparse.train.inputs import raw_source

    if args.config:
        data = load_config(args.config, {"data.path": args.path}).data
        label = data.columns.label if data.columns else "label"
    else:
        from cosparse.config import DataConfig

        parquet = args.path.endswith((".parquet", ".pq"))
        data = DataConfig(reader="parquet" if parquet else "csv", path=args.path)
        label = None
    data = dataclasses.replace(data, batch_size=args.batch_size, eval_fraction=0.0,
                               columns=dataclasses.replace(
                                   data.columns or ColumnsConfig(), label=None, drop=[]))
    source = raw_source(data, "train")
    if getattr(source, "delimiter_note", None):
        print(source.delimiter_note, file=sys.stderr)  # type: ignore[attr-defined]
    types = getattr(source, "types", {c: NAME_OF_KIND[k] for c, k in source.columns.items()})
    print(run_describe(source, types, args.path, label, args.rows, not args.no_progress))
    return 0


def _data_baseline(args: argparse.Namespace) -> int:
    """``cosparse data baseline``: the AUC a model must beat on the config's own split."""
    from cosparse.train.baseline import auto_kind, logistic_regression, popularity
    from cosparse.train.inputs import model_inputs

    inputs = model_inputs(load_config(args.config, {"data.path": args.data} if args.data else {}))
    for note in inputs.notes:
        print(note, file=sys.stderr)
    if args.kind == "auto":
        args.kind, why = auto_kind(inputs.train, inputs.cfg.data.negatives is not None)
        print(f"baseline: {args.kind} ({why})", file=sys.stderr)
    if args.kind == "popularity":
        result = popularity(inputs.train, inputs.eval)
    else:
        result = logistic_regression(inputs.train, inputs.eval, epochs=args.epochs, lr=args.lr)
    print(json.dumps({"baseline": args.kind, "auc": result.auc, "auc_se": result.auc_se,
                      "eval_samples": result.eval_samples}))
    return 0


def add_data_parser(sub: argparse._SubParsersAction) -> None:
    dp = sub.add_parser("data", help="look at a data file before writing a config")
    dps = dp.add_subparsers(dest="data_command", required=True)
    d = dps.add_parser("describe", help="each column's type, distinct values, nulls and range, "
                                        "the label's balance and a data.columns block")
    d.add_argument("path", help="a CSV/TSV file (plain or .gz), a directory, a glob, or Parquet")
    d.add_argument("--config", default=None, help="read it as this config's data section does "
                                                  "(reader, csv options, schema, label)")
    d.add_argument("--rows", type=int, default=None, help="only the first N rows (default: all)")
    d.add_argument("--batch-size", type=int, default=65536, help="rows read at a time")
    d.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    d.set_defaults(func=_data_describe)
    b = dps.add_parser("baseline", help="the eval AUC of a simple baseline on the config's own "
                                        "features and split: item popularity or logistic "
                                        "regression over the hashed IDs")
    b.add_argument("--config", required=True)
    b.add_argument("--data", default=None, help="override data.path")
    b.add_argument("--kind", choices=["auto", "popularity", "logistic"], default="auto",
                   help="auto: popularity for implicit feedback with an 'item' feature (sampled "
                        "negatives, or every label 1), else logistic")
    b.add_argument("--epochs", type=int, default=3, help="logistic: passes over the train split")
    b.add_argument("--lr", type=float, default=0.05, help="logistic: Adagrad's learning rate")
    b.set_defaults(func=_data_baseline)
