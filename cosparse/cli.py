"""Command line: ``cosparse train`` and ``cosparse plan`` (more subcommands arrive with their issues)."""

from __future__ import annotations

import argparse
import json
import sys

from cosparse.config import ConfigError, load_config


def _train(args: argparse.Namespace) -> int:
    from cosparse.data.errors import DataError
    from cosparse.train.trainer import Trainer

    overrides = {}
    if args.steps is not None:
        overrides["train.steps"] = args.steps
    if args.metrics_json:
        overrides["train.metrics_json"] = args.metrics_json
    if args.data:
        overrides["data.path"] = args.data
    if args.no_progress:
        overrides["train.progress"] = False
    try:
        cfg = load_config(args.config, overrides)
        trainer = Trainer(cfg)
    except (ConfigError, DataError) as e:
        print(f"cosparse: error: {e}", file=sys.stderr)
        return 2
    try:
        if args.resume:
            trainer.resume(args.resume)
        final = trainer.run()
    except DataError as e:
        print(f"cosparse: data error: {e}", file=sys.stderr)
        return 3
    finally:
        trainer.close()
    print(json.dumps({"final": final}, sort_keys=True))
    return 0


def _capacities(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"cannot read {text!r} as comma-separated numbers") from e
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("capacities must be positive numbers")
    return values


def _plan(args: argparse.Namespace) -> int:
    from cosparse.data.errors import DataError
    from cosparse.tune.run import run_plan

    overrides = {"data.path": args.data} if args.data else {}
    try:
        cfg = load_config(args.config, overrides)
        run_plan(cfg, args.steps, args.out, args.capacities, args.lookahead, args.decay,
                 progress=not args.no_progress, config_path=str(args.config))
    except (ConfigError, ValueError) as e:
        print(f"cosparse: error: {e}", file=sys.stderr)
        return 2
    except DataError as e:
        print(f"cosparse: data error: {e}", file=sys.stderr)
        return 3
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cosparse", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a model from a YAML config")
    t.add_argument("--config", required=True)
    t.add_argument("--steps", type=int, default=None, help="override train.steps")
    t.add_argument("--metrics-json", default=None, help="write metrics as JSON lines here")
    t.add_argument("--resume", default=None, help="checkpoint dir (or root with LATEST) to resume")
    t.add_argument("--data", default=None, help="override data.path")
    t.add_argument("--no-progress", action="store_true", help="plain log lines, no progress bar")
    t.set_defaults(func=_train)
    pl = sub.add_parser("plan", help="replay the ID trace and simulate device-cache hit rates")
    pl.add_argument("--config", required=True)
    pl.add_argument("--data", default=None, help="override data.path")
    pl.add_argument("--steps", type=int, required=True, help="batches of the trace to replay")
    pl.add_argument("--out", default="runs/plan", help="directory for plan.json and plan.png")
    pl.add_argument("--capacities", type=_capacities, default=[0.01, 0.02, 0.05, 0.1, 0.2, 0.5],
                    help="fractions of each table's distinct IDs (values > 1: rows)")
    pl.add_argument("--lookahead", type=int, default=4, help="window of lookahead-k (0: off)")
    pl.add_argument("--decay", type=float, default=0.99, help="hotness decay per batch")
    pl.add_argument("--no-progress", action="store_true", help="no progress bars")
    pl.set_defaults(func=_plan)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
