"""``cosparse tune``: the offline tuning agent (Optuna trials of short real runs), or a replay
of its journal.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

from cosparse.cli.arguments import budgets
from cosparse.config import ConfigError, config_from_mapping


def add_tune_parser(sub: Any) -> None:
    tu = sub.add_parser("tune", help="search the config's exact knobs with short real runs "
                                     "(Optuna), within budgets, and write the best config")
    tu.add_argument("--config", default=None, help="the start configuration (YAML)")
    tu.add_argument("--model-path", action="append", default=[], metavar="DIR",
                    help="a folder to import model.factory's module from (repeatable; also "
                         "PYTHONPATH); every trial finds it there too")
    tu.add_argument("--trials", type=int, default=20, help="candidates to run")
    tu.add_argument("--minutes", type=float, default=None, help="stop starting trials after this")
    tu.add_argument("--budget", type=budgets, default={},
                    help="device=SIZE,host=SIZE,ps_bytes_per_step=SIZE: Optuna constraints")
    tu.add_argument("--warmup", type=int, default=4, help="steps before the measured windows")
    tu.add_argument("--windows", type=int, default=6, help="measured windows per trial")
    tu.add_argument("--window-steps", type=int, default=4, help="steps per measured window")
    tu.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    tu.add_argument("--out", default="runs/tune", help="journal, best.yaml, diff.txt, report")
    tu.add_argument("--allow", choices=["semantic"], default=None,
                    help="semantic: apply a semantic knob (batch size, learning rates, admission, "
                         "TTL) that passes the AUC gate; without it they are suggestions only")
    tu.add_argument("--auc-gate", type=float, default=0.0,
                    help="the held-out AUC a semantic change may lose (default 0)")
    tu.add_argument("--ranks", type=int, default=1,
                    help="also try world sizes up to this (torchrun trials on this host) and "
                         "every table's sharding: reordering knobs, kept within the "
                         "parallelism tolerance of the start (default 1: none)")
    tu.add_argument("--no-semantic", action="store_true",
                    help="skip measuring the semantic knobs (no suggestions)")
    tu.add_argument("--replay", default=None, metavar="LOG",
                    help="re-derive the decision from a journal, running nothing")
    tu.set_defaults(func=_tune)


def _tune(args: argparse.Namespace) -> int:
    """The offline agent (``cosparse.autotune``), or a replay of its journal."""
    from cosparse.autotune.agent import Window, load, replay, tune
    from cosparse.autotune.knobs import exact_knobs, reordering_knobs, semantic_knobs
    from cosparse.autotune.output import write_outputs
    from cosparse.autotune.types import Budgets
    from cosparse.config.load import read_config_mapping
    from cosparse.config.sizes import parse_bytes

    if args.replay:
        again, recorded = replay(Path(args.replay))
        same = recorded is not None and again["trial"] == recorded["trial"] and \
            again["params"] == recorded["params"] and \
            again.get("semantic") == recorded.get("semantic")
        print(json.dumps({"replayed": again, "recorded": recorded, "same": same}, indent=1))
        return 0 if same else 1
    if not args.config:
        raise ConfigError("cosparse tune: --config is needed (or --replay LOG)")
    from cosparse.api.factory import add_model_paths

    add_model_paths(args.model_path)  # (model.factory's module, for every trial too)
    raw = read_config_mapping(args.config)
    cfg = config_from_mapping(copy.deepcopy(raw))
    b = args.budget
    budgets = Budgets(
        device_bytes=parse_bytes(b["device"], "--budget device") if "device" in b else None,
        host_bytes=parse_bytes(b["host"], "--budget host") if "host" in b else None,
        ps_bytes_per_step=parse_bytes(b["ps_bytes_per_step"], "--budget ps_bytes_per_step")
        if "ps_bytes_per_step" in b else None)
    out = Path(args.out)
    window = Window(args.warmup, args.windows, args.window_steps)
    knobs = exact_knobs(cfg) + reordering_knobs(cfg, args.ranks)
    decision = tune(raw, knobs, budgets, out, args.trials, window, args.minutes,
                    seed=args.seed, semantic=None if args.no_semantic else semantic_knobs(cfg),
                    allow_semantic=args.allow == "semantic", auc_gate=args.auc_gate)
    paths = write_outputs(load(out / "journal.log"), decision, out)
    print(json.dumps({"decision": decision, **{k: str(v) for k, v in paths.items()}}, indent=1))
    return 0
