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
from cosparse.parallel.stats import Hotness, table_stats
from cosparse.parallel.types import PSSupply, ShardingPlan
from cosparse.parallel.world import World, from_leader, start_world

# what the many-rank engine does not run: each names its setting
_NOT_YET = {
    "models": lambda c: bool(c.models),
    "store.admit_after": lambda c: c.store.admit_after > 1,
    # architecture A pulls each rank's own rows: nothing is sharded across ranks
    "parallel.sharding (with supply.path ps-direct)": lambda c: c.supply.path == "ps-direct"
    and bool(c.parallel.sharding),
}


@dataclass
class RankSetup:
    world: World
    # None: architecture A, every rank looks its own samples' rows up on the shared PS
    plan: ShardingPlan | None
    shard_cfg: Config  # the run's config with this rank's shards as its tables
    balance: str = "samples"  # how global batches split over the ranks (``parallel.data``)


def make_plan(cfg: Config, probe: list[SparseBatch], world_size: int, ranks_per_node: int,
              hotness: Hotness | None = None) -> ShardingPlan:
    """The sharding of ``cfg``'s tables over ``world_size`` ranks (statistics from ``probe``;
    ``hotness``: the capacity planner's curves, priced over a PS supply path; the rows each
    table will hold by ``train.steps``, from its vocabulary's growth over ``probe``)."""
    par = cfg.parallel
    supply = ps_supply(cfg)
    stats = table_stats(cfg.tables, probe, hotness if supply is not None else None,
                        cfg.train.steps)
    return plan_sharding(
        cfg.tables, stats, cfg.data.batch_size, world_size,
        ranks_per_node, par.sharding, par.link_gbps,
        par.device_budget_bytes or cfg.store.device.budget_bytes,  # type: ignore[arg-type]
        par.host_budget_bytes, par.replicate_below_bytes, supply)  # type: ignore[arg-type]


def ps_supply(cfg: Config) -> PSSupply | None:
    """The PS beneath the shards of ``cfg``'s supply path (None: resident rows, or A, whose
    ranks shard nothing): each table's tier rows, when the config gives them as rows."""
    if cfg.supply.path not in ("collaborative", "ps-tiered"):
        return None
    dev, host = cfg.store.device.rows, cfg.store.host.rows
    rows = None if host is None else host + (dev or 0)  # (an unbounded host holds them all)
    link = "worker_ps" if cfg.supply.path == "collaborative" else "trainer_ps.pull"
    return PSSupply(link, {t.name: rows for t in cfg.tables})


def start_rank(cfg: Config, device: torch.device, probe: Callable[[], list[SparseBatch]],
               log: Callable[[str], None], hotness: Hotness | None = None) -> RankSetup:
    """Join torchrun's world and plan this rank's shards (``hotness``: see ``make_plan``)."""
    for key, unsupported in _NOT_YET.items():
        if unsupported(cfg):
            raise ConfigError(f"{key}: not supported under torchrun with more than one rank "
                              "yet; run it on one process")
    world = start_world(cfg, device)
    if world.nodes > 1 and cfg.supply.path != "resident" and cfg.store.remote.embedded:
        world.close()  # (every rank sees the same world and config: all of them stop here)
        raise ConfigError(
            f"store.remote.embedded: rank 0's embedded PS shards listen on its loopback, which "
            f"the ranks of the other {world.nodes - 1} node(s) cannot reach; start the shards "
            "with `cosparse ps serve --bind ADDR:PORT --auth-key FILE` and list them in "
            "store.remote.endpoints (or store.remote.discovery: tcpstore)")
    balance = cfg.parallel.balance
    if balance == "auto":
        balance = "ids" if any(t.pooling == "none" for t in cfg.tables) else "samples"
    if cfg.supply.path == "ps-direct":
        if world.leader:
            log(f"architecture A on {world.size} ranks: every rank pulls its own samples' rows "
                "from the shared PS and pushes their gradients")
        return RankSetup(world, None, cfg, balance)
    try:  # rank 0 plans and every rank takes its plan: one plan, whatever each rank measured
        sent = [make_plan(cfg, probe(), world.size, world.ranks_per_node, hotness)
                if world.leader else None]
        dist.broadcast_object_list(sent, src=0)
        plan: ShardingPlan = sent[0]  # type: ignore[assignment]
    except BaseException:
        world.close()
        raise
    if world.leader:
        log(plan.describe())
    shard_cfg = dataclasses.replace(cfg, tables=rank_tables(plan, cfg.tables, world.rank))
    return RankSetup(world, plan, shard_cfg, balance)


def share_ps(setup: RankSetup, endpoints: list[str] | None, error: str | None = None
             ) -> list[str]:
    """One PS for all ranks: rank 0 started its shards and gives their ``endpoints`` (or the
    ``error`` that stopped it); every other rank gets them here."""
    got = from_leader(setup.world, (endpoints, error))
    eps, err = got  # type: ignore[misc]
    if err is not None:
        raise RuntimeError(f"rank 0 could not start the PS shards: {err}")
    return eps


def reach_shared_ps(cfg: Config, endpoints: list[str]) -> Config:
    """``cfg`` for a rank that reaches rank 0's shards instead of starting its own."""
    remote = dataclasses.replace(cfg.store.remote, embedded=False, endpoints=list(endpoints),
                                 discovery="config", data_dir=None)
    return dataclasses.replace(cfg, store=dataclasses.replace(cfg.store, remote=remote))
