"""``cosparse plan cache|tiers|sharding``: the device cache's hit rates replayed from the ID
trace, the tiers' sizes under budgets, or the tables' sharding over ranks. The older spelling
(``plan --config X``, ``--tiers``, ``--sharding``) still works.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from cosparse.cli.arguments import budgets, capacities
from cosparse.config import ConfigError, load_config


def _plan(args: argparse.Namespace) -> int:
    if not args.config:
        raise ConfigError("cosparse plan: --config is required (plan cache|tiers|sharding "
                          "--config X.yaml)")
    if args.sharding:
        return _plan_sharding(args)
    if args.tiers:
        return _plan_tiers(args)
    if args.steps is None:
        raise ConfigError("cosparse plan: --steps is required (batches of the trace to replay)")
    from cosparse.train.inputs import model_inputs
    from cosparse.tune.run import run_plan

    def body() -> int:
        inputs = model_inputs(load_config(args.config,
                                          {"data.path": args.data} if args.data else {}))
        run_plan(inputs.cfg, args.steps, args.out or "runs/plan", args.capacities,
                 args.lookahead, args.decay, progress=not args.no_progress,
                 config_path=str(args.config), reader=inputs.train)
        return 0

    return body()


def _plan_tiers(args: argparse.Namespace) -> int:
    """Device and host sizes, PS shards and traffic under budgets, and their drift."""
    from cosparse.config.sizes import parse_bytes
    from cosparse.train.inputs import model_inputs
    from cosparse.tune.tiers import describe, drift, plan_tiers
    from cosparse.tune.trace import build_traces

    if args.steps is None:
        raise ConfigError("cosparse plan --tiers: --steps is required (batches to replay)")
    if "device" not in args.budget:
        raise ConfigError("cosparse plan --tiers: --budget device=SIZE is required")
    device = parse_bytes(args.budget["device"], "--budget device")
    host = parse_bytes(args.budget["host"], "--budget host") if "host" in args.budget else None
    shard = parse_bytes(args.ps_shard_memory, "--ps-shard-memory")
    policies = tuple(args.policies.split(",")) if args.policies else None

    def recommend(path: str) -> Any:
        inputs = model_inputs(load_config(path, {"data.path": args.data} if args.data else {}))
        traces = build_traces(inputs.cfg, args.steps, progress=not args.no_progress,
                              reader=inputs.train)
        return plan_tiers(inputs.cfg, traces, device, host, shard, policies)

    rep = recommend(args.config)
    print(describe(rep))
    doc: dict[str, Any] = {"config": str(args.config), "steps": args.steps, **rep.to_dict()}
    if args.drift:
        later = recommend(args.drift)
        doc["drift"] = {"config": str(args.drift), **drift(rep, later)}
        print(f"\ndrift to {args.drift}:")
        print(describe(later))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "tiers.json").write_text(json.dumps(doc, indent=1))
        print(f"wrote {out / 'tiers.json'}")
    return 0


def _plan_sharding(args: argparse.Namespace) -> int:
    """The sharding planner on paper: statistics from the config's reader, the world given."""
    import itertools

    from cosparse.parallel.engine import make_plan
    from cosparse.train.inputs import model_inputs
    from cosparse.tune.hotness import table_hotness

    overrides: dict[str, object] = {"data.path": args.data} if args.data else {}
    if args.link_gbps is not None:
        overrides["parallel.link_gbps"] = args.link_gbps
    cfg = load_config(args.config, overrides)
    per_node = args.ranks_per_node or cfg.parallel.ranks_per_node or min(args.ranks, 8)
    if args.ranks < 1 or args.ranks % per_node:
        raise ConfigError(f"--ranks {args.ranks}: not a whole number of nodes of {per_node} ranks")
    inputs = model_inputs(cfg)
    cfg, reader = inputs.cfg, inputs.train
    tasks = reader.tasks()
    probe = [reader.build(t) for t in itertools.islice(tasks, args.steps or 50)]
    if hasattr(tasks, "close"):
        tasks.close()
    plan = make_plan(cfg, probe, args.ranks, per_node, table_hotness(cfg))
    print(f"from {len(probe)} batches of {cfg.data.batch_size} samples")
    print(plan.describe())
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        cost = plan.cost
        doc = {"world_size": plan.world_size, "ranks_per_node": plan.ranks_per_node,
               "tables": {n: {"kind": s.kind, "owners": list(s.owners),
                              "chosen_by": plan.chosen_by.get(n)} for n, s in plan.tables.items()},
               "predicted": None if cost is None else {
                   "link_bytes_per_step": cost.link_bytes, "sent_bytes_per_rank": cost.sent_bytes,
                   "held_bytes_per_rank": cost.held_bytes, "ps_bytes_per_rank": cost.ps_bytes,
                   "busiest_rank_s": cost.seconds,
                   "link_gbps": cost.link_gbps}}
        (out / "sharding.json").write_text(json.dumps(doc, indent=1))
        print(f"wrote {out / 'sharding.json'}")
    return 0


def add_plan_parser(sub: argparse._SubParsersAction) -> None:
    """The ``plan`` command: ``plan cache|tiers|sharding``, each with its own options (and the
    older spelling, ``plan --config X [--tiers | --sharding]``, with all of them)."""
    pl = sub.add_parser("plan", help="plan the device cache (hit rates replayed from the ID "
                                     "trace), the tiers under budgets, or the sharding over ranks")
    _common(pl, required=False)
    _cache_options(pl)
    _tiers_options(pl)
    _sharding_options(pl)
    pl.add_argument("--sharding", action="store_true", help=argparse.SUPPRESS)  # plan sharding
    pl.add_argument("--tiers", action="store_true", help=argparse.SUPPRESS)  # plan tiers
    pl.set_defaults(func=_plan)
    kinds = pl.add_subparsers(dest="plan_command", metavar="{cache,tiers,sharding}")
    cache = kinds.add_parser("cache", help="replay the ID trace and simulate device-cache hit "
                                           "rates for each policy and Belady's optimum")
    _common(cache)
    _cache_options(cache)
    cache.set_defaults(func=_plan, sharding=False, tiers=False)
    tiers = kinds.add_parser("tiers", help="recommend device and host sizes and PS shards under "
                                           "--budget, with each tier's hit rate and PS bytes")
    _common(tiers)
    _tiers_options(tiers)
    tiers.set_defaults(func=_plan_tiers)
    sharding = kinds.add_parser("sharding", help="plan the tables' sharding over --ranks")
    _common(sharding)
    _sharding_options(sharding)
    sharding.set_defaults(func=_plan_sharding)


def _common(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--config", required=required, default=None)
    p.add_argument("--data", default=None, help="override data.path")
    p.add_argument("--steps", type=int, default=None,
                   help="batches of the trace to replay (sharding: the statistics' batches, "
                        "default 50)")
    p.add_argument("--out", default=None,
                   help="directory for plan.json and plan.png (default runs/plan); tiers: "
                        "tiers.json, sharding: sharding.json (default: print only)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _cache_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--capacities", type=capacities, default=[0.01, 0.02, 0.05, 0.1, 0.2, 0.5],
                   help="fractions of each table's distinct IDs (values > 1: rows)")
    p.add_argument("--lookahead", type=int, default=4, help="window of lookahead-k (0: off)")
    p.add_argument("--decay", type=float, default=0.99, help="hotness decay per batch")


def _tiers_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget", type=budgets, default={},
                   help="device=SIZE[,host=SIZE] (no host budget: every row fits)")
    p.add_argument("--ps-shard-memory", default="16GiB",
                   help="the memory of one PS shard, for the shard count")
    p.add_argument("--policies", default=None,
                   help="eviction policies to choose from (default lru,lfu,hotness)")
    p.add_argument("--drift", default=None, metavar="CONFIG",
                   help="a second workload (this week's): how the sizes change")


def _sharding_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", type=int, default=2, help="the world size")
    p.add_argument("--ranks-per-node", type=int, default=None,
                   help="ranks per node (default parallel.ranks_per_node, or 8)")
    p.add_argument("--link-gbps", type=float, default=None,
                   help="rank-to-rank link bandwidth (default parallel.link_gbps)")
