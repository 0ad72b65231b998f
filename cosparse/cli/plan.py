"""``cosparse plan``: the device cache's hit rates replayed from the ID trace, the tiers'
sizes under budgets (``--tiers``), or the tables' sharding over ranks (``--sharding``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from cosparse.cli.arguments import budgets, capacities
from cosparse.config import ConfigError, load_config


def _plan(args: argparse.Namespace) -> int:
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
    """The ``plan`` command."""
    pl = sub.add_parser("plan", help="replay the ID trace and simulate device-cache hit rates")
    pl.add_argument("--config", required=True)
    pl.add_argument("--data", default=None, help="override data.path")
    pl.add_argument("--steps", type=int, default=None,
                    help="batches of the trace to replay (--sharding: the statistics' batches, "
                         "default 50)")
    pl.add_argument("--out", default=None,
                    help="directory for plan.json and plan.png (default runs/plan), or, with "
                         "--sharding, sharding.json (default: print only)")
    pl.add_argument("--sharding", action="store_true",
                    help="plan the tables' sharding over --ranks instead of the cache")
    pl.add_argument("--tiers", action="store_true",
                    help="recommend device and host sizes and PS shards under --budget, with "
                         "the hit rate of each tier and the PS bytes per step they predict")
    pl.add_argument("--budget", type=budgets, default={},
                    help="--tiers: device=SIZE[,host=SIZE] (no host budget: every row fits)")
    pl.add_argument("--ps-shard-memory", default="16GiB",
                    help="--tiers: the memory of one PS shard, for the shard count")
    pl.add_argument("--policies", default=None,
                    help="--tiers: eviction policies to choose from (default lru,lfu,hotness)")
    pl.add_argument("--drift", default=None, metavar="CONFIG",
                    help="--tiers: a second workload (this week's): how the sizes change")
    pl.add_argument("--ranks", type=int, default=2, help="--sharding: the world size")
    pl.add_argument("--ranks-per-node", type=int, default=None,
                    help="--sharding: ranks per node (default parallel.ranks_per_node, or 8)")
    pl.add_argument("--link-gbps", type=float, default=None,
                    help="--sharding: rank-to-rank link bandwidth (default parallel.link_gbps)")
    pl.add_argument("--capacities", type=capacities, default=[0.01, 0.02, 0.05, 0.1, 0.2, 0.5],
                    help="fractions of each table's distinct IDs (values > 1: rows)")
    pl.add_argument("--lookahead", type=int, default=4, help="window of lookahead-k (0: off)")
    pl.add_argument("--decay", type=float, default=0.99, help="hotness decay per batch")
    pl.add_argument("--no-progress", action="store_true", help="no progress bars")
    pl.set_defaults(func=_plan)
