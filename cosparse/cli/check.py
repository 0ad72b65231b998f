"""``cosparse check``: train the config's model on the all-resident engine and on every
placement that promises the same bits, and print how far each is from the resident run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

_HELP = ("train the config's model on resident, tiered (a 10%% device tier), spill (a host tier "
         "spilling to the PS), ps-direct and collaborative, plus a save mid-run and a resume; "
         "print the largest difference of each from the resident run in loss, rows and dense "
         "parameters; exit 1 when one is not bit-identical (all of them promise it)")


def add_check_parser(sub: argparse._SubParsersAction) -> None:
    """The ``check`` command (its parser imports nothing heavy: ``ps serve`` shares it)."""
    c = sub.add_parser("check", help=_HELP.split(";")[0] + "; exit 1 on a difference",
                       description=_HELP.replace("%%", "%"))
    c.add_argument("--config", required=True, help="a config with a built-in model.kind, or "
                   "a model of your own by model.factory (or cosparse.check(build_model, "
                   "config) in Python)")
    c.add_argument("--model-path", action="append", default=[], metavar="DIR",
                   help="a folder where model.factory's module is found (repeatable)")
    c.add_argument("--steps", type=int, default=None,
                   help="steps of each run (default train.steps; at least 2)")
    c.add_argument("--data", default=None, help="override data.path")
    c.add_argument("--only", default=None, metavar="PLACEMENT[,...]",
                   help="check these placements alone (of tiered,spill,ps-direct,"
                        "collaborative,resume)")
    c.set_defaults(func=_check)


def _check(args: argparse.Namespace) -> int:
    from cosparse.api.check import check
    from cosparse.config import load_config
    from cosparse.train.placements import CHECKED

    cfg = load_config(args.config, {"data.path": args.data} if args.data else {})
    only = tuple(p.strip() for p in args.only.split(",") if p.strip()) if args.only else CHECKED
    result = check(_factory_builder(cfg, args.model_path), cfg, steps=args.steps,
                   placements=only, log=lambda m: print(m, file=sys.stderr))
    print(result.table())
    print(f"check: {'bit-identical on every placement' if result.ok else 'NOT bit-identical'} "
          f"({result.steps} steps)")
    return 0 if result.ok else 1


def _factory_builder(cfg: Any, model_paths: list[str]) -> Callable[[], Any] | None:
    """A builder of fresh models through ``model.factory`` (None: the built-in model.kind)."""
    if not cfg.model.factory:
        return None
    from cosparse.api.factory import add_model_paths, build_factory_model
    from cosparse.train.inputs import model_inputs

    add_model_paths(model_paths)
    num_dense = model_inputs(cfg).train.num_dense
    return lambda: build_factory_model(cfg, num_dense)
