"""One rank's part of a many-rank run, set up in one call: join the world, plan the sharding
(the pins of ``parallel.sharding``, the planner for the rest), and the config of this rank's
own shards, from which the supply path builds their placements like one process's tables."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from cosparse.batch import SparseBatch
from cosparse.config import Config, ConfigError
from cosparse.parallel.planner import plan_sharding
from cosparse.parallel.shards import rank_tables
from cosparse.parallel.stats import table_stats
from cosparse.parallel.types import ShardingPlan
from cosparse.parallel.world import World, start_world

# what the many-rank engine does not run yet: each names its setting
_NOT_YET = {
    "supply.path": lambda c: c.supply.path != "resident",
    "models": lambda c: bool(c.models),
    "store.admit_after": lambda c: c.store.admit_after > 1,
}


@dataclass
class RankSetup:
    world: World
    plan: ShardingPlan
    shard_cfg: Config  # the run's config with this rank's shards as its tables
    balance: str = "samples"  # how global batches split over the ranks (``parallel.data``)


def make_plan(cfg: Config, probe: list[SparseBatch], world_size: int,
              ranks_per_node: int) -> ShardingPlan:
    """The sharding of ``cfg``'s tables over ``world_size`` ranks (statistics from ``probe``)."""
    par = cfg.parallel
    return plan_sharding(
        cfg.tables, table_stats(cfg.tables, probe), cfg.data.batch_size, world_size,
        ranks_per_node, par.sharding, par.link_gbps,
        par.device_budget_bytes or cfg.store.device.budget_bytes,  # type: ignore[arg-type]
        par.host_budget_bytes, par.replicate_below_bytes)  # type: ignore[arg-type]


def start_rank(cfg: Config, device: torch.device, probe: Callable[[], list[SparseBatch]],
               log: Callable[[str], None]) -> RankSetup:
    """Join torchrun's world and plan this rank's shards."""
    for key, unsupported in _NOT_YET.items():
        if unsupported(cfg):
            raise ConfigError(f"{key}: not supported under torchrun with more than one rank yet "
                              "(the parallel engine runs resident or tiered tables); run "
                              "it on one process")
    world = start_world(cfg, device)
    try:  # rank 0 plans and every rank takes its plan: one plan, whatever each rank measured
        sent = [make_plan(cfg, probe(), world.size, world.ranks_per_node) if world.leader
                else None]
        dist.broadcast_object_list(sent, src=0)
        plan: ShardingPlan = sent[0]  # type: ignore[assignment]
    except BaseException:
        world.close()
        raise
    if world.leader:
        log(plan.describe())
    shard_cfg = dataclasses.replace(cfg, tables=rank_tables(plan, cfg.tables, world.rank))
    balance = cfg.parallel.balance
    if balance == "auto":
        balance = "ids" if any(t.pooling == "none" for t in cfg.tables) else "samples"
    return RankSetup(world, plan, shard_cfg, balance)
