"""Command line: ``cosparse train`` (more subcommands arrive with their issues)."""

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
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
