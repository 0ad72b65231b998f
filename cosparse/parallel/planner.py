"""The sharding planner: each table's sharding type and home, for a world of ranks.

For every candidate it estimates the bytes each rank sends per step (the ID all-to-all, the
output all-to-all or reduce-scatter, the backward, a replica's gradient gather) and the bytes
each rank holds; over a PS, also the bytes each shard pulls from it and pushes to it, from the
table's hotness (the capacity planner's curve) at the share of its rows the shard's tiers hold,
so that a replica's, or a large shard's, misses count. It places tables largest first, each
where the busiest rank's link time grows least, among the candidates that fit the device and
host budgets. Pinned tables keep their type.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from cosparse.config import ConfigError, TableConfig
from cosparse.parallel.shards import sharding_of
from cosparse.parallel.types import PlanCost, PSSupply, ShardingPlan, TableSharding, TableStats

KINDS = ("data_parallel", "table_wise", "column_wise", "row_wise", "table_row_wise")


def sent_bytes(s: TableSharding, st: TableStats, batch: int, world: int) -> np.ndarray:
    """Bytes each rank sends to other ranks per step for one table (IDs and bag lengths in,
    rows out, gradients back), as the sharded collection moves them."""
    out = np.zeros(world)
    local = batch / world  # samples per rank
    ids = local * st.ids_per_sample  # IDs per rank
    n = len(s.owners)
    width = st.dim / n if s.kind == "column_wise" else st.dim
    for r in range(world):
        others = [o for o in s.owners if o != r]
        # input: bag lengths and IDs to each owner (hash routing: the owner's share)
        share = ids / n if s.route == "hash" else ids
        out[r] += len(others) * (8 * local * st.features + 8 * share)
        if s.replicated:  # the slice's gradient, to every other replica
            out[r] += (world - 1) * 4 * st.dim * (local * st.features if st.pooled else ids)
            continue
        # rows per (owner, rank) pair: a pooled feature's one per sample, a sequence's per ID
        rows = local * st.features if st.pooled else (ids / n if s.route == "hash" else ids)
        out[r] += len(others) * 4 * width * rows  # this rank's gradient to each other owner
        if r in s.owners:  # this owner's rows to every other rank
            out[r] += (world - 1) * 4 * width * rows
    return out


def ps_bytes(s: TableSharding, st: TableStats, world: int, supply: PSSupply | None
             ) -> tuple[np.ndarray, np.ndarray]:
    """Bytes each rank pulls from the PS per step (the misses of its shard's tiers: an ID out,
    a row with its optimizer state and version back) and pushes to it (the rows its tiers
    evict: ID and row), from the table's hotness at the share of its rows the shard caches.
    Every shard looks up the global batch's rows it owns: a replica all of them."""
    pull, push = np.zeros(world), np.zeros(world)
    if supply is None:
        return pull, push
    n = len(s.owners)
    hashed = s.route == "hash"
    unique = st.unique_per_batch / n if hashed else st.unique_per_batch
    owned = max(1.0, (st.distinct or st.rows) / (n if hashed else 1))
    cached = supply.cache_rows.get(s.table)
    share = 1.0 if cached is None else min(1.0, cached / owned)
    fetch, evict = _at(st.hotness, share)
    for o, (c0, c1) in zip(s.owners, s.columns, strict=True):
        width = st.row_bytes * (c1 - c0) / st.dim
        pull[o] += unique * fetch * (16 + width)
        push[o] += unique * evict * (8 + width)
    return pull, push


def _at(curve: tuple[tuple[float, float, float], ...], share: float) -> tuple[float, float]:
    """Fetches and evictions per unique row at ``share``, interpolated (none known: every row
    fetched, none evicted)."""
    if not curve:
        return 1.0, 0.0
    xs = [c[0] for c in curve]
    return (float(np.interp(share, xs, [c[1] for c in curve])),
            float(np.interp(share, xs, [c[2] for c in curve])))


def held_bytes(s: TableSharding, st: TableStats, world: int) -> np.ndarray:
    out = np.zeros(world)
    for o, (c0, c1) in zip(s.owners, s.columns, strict=True):
        frac = (c1 - c0) / st.dim
        rows = st.rows / len(s.owners) if s.route == "hash" else st.rows
        out[o] += rows * st.row_bytes * frac
    return out


def _candidates(t: TableConfig, st: TableStats, world: int, per_node: int,
                replicate_below: int, pinned: str | None, load: np.ndarray,
                held: np.ndarray) -> list[TableSharding]:
    """Every placement of every allowed kind: a table-wise table on each rank, a table-row-wise
    one on each node, a column-wise one's shards on the least-loaded ranks (by link bytes so
    far, then bytes held, then rank), so that a later table's columns go where earlier ones
    are not."""
    kinds = [pinned] if pinned else [k for k in KINDS if _allowed(k, t, st, world, per_node,
                                                                  replicate_below)]
    idle_first = np.lexsort((np.arange(world), held, load))
    columns = tuple(sorted(int(r) for r in idle_first[:min(world, t.dim)]))
    out = []
    for k in kinds:
        homes = range(world) if k == "table_wise" else range(world // per_node) \
            if k == "table_row_wise" else [0]
        out += [sharding_of(k, t, world, per_node, h, columns) for h in homes]
    return out


def _allowed(kind: str, t: TableConfig, st: TableStats, world: int, per_node: int,
             replicate_below: int) -> bool:
    if kind == "data_parallel":
        return st.rows * st.row_bytes <= replicate_below
    if kind == "column_wise":
        return t.optimizer.kind != "rowwise_adagrad" and t.dim >= 2 and world > 1
    if kind == "table_row_wise":
        return world // per_node > 1
    return True


def plan_sharding(tables: list[TableConfig], stats: Mapping[str, TableStats], batch: int,
                  world: int, ranks_per_node: int, pins: Mapping[str, str], link_gbps: float,
                  device_budget: int | None, host_budget: int | None,
                  replicate_below: int, supply: PSSupply | None = None) -> ShardingPlan:
    """The cheapest plan that fits: tables largest first, each on the candidate that keeps the
    busiest rank's link time lowest (what it sends other ranks, and, over a PS ``supply``,
    what it pulls from and pushes to the PS) while every rank's bytes stay in the budget."""
    # a shard's rows fit in its device tier and the host tier beneath it
    budget = None if host_budget is None else host_budget + (device_budget or 0)
    sent, pulled, pushed, held = (np.zeros(world) for _ in range(4))
    chosen: dict[str, TableSharding] = {}
    order = sorted(tables, key=lambda t: -stats[t.name].rows * stats[t.name].row_bytes)
    bps = link_gbps * 1e9 / 8
    for t in order:
        st = stats[t.name]
        best: tuple[float, float, TableSharding, tuple[np.ndarray, ...]] | None = None
        for cand in _candidates(t, st, world, ranks_per_node, replicate_below,
                                pins.get(t.name), sent + pulled + pushed, held):
            adds = (sent_bytes(cand, st, batch, world), *ps_bytes(cand, st, world, supply),
                    held_bytes(cand, st, world))
            load = sent + pulled + pushed + adds[0] + adds[1] + adds[2]
            h2 = held + adds[3]
            fits = budget is None or h2.max() <= budget
            key = (0.0 if fits else 1.0, load.max() / bps + 1e-15 * h2.max())
            if best is None or key < best[:2]:
                best = (*key, cand, adds)
        assert best is not None
        if best[0] and t.name in pins:
            raise ConfigError(f"parallel.sharding.{t.name}: {pins[t.name]} does not fit the "
                              f"budget of {budget} bytes per rank")
        chosen[t.name] = best[2]
        for total, add in zip((sent, pulled, pushed, held), best[3], strict=True):
            total += add
    links = {"rank_rank": float(sent.sum())}
    if supply is not None:
        links |= {supply.pull_link: float(pulled.sum()), "trainer_ps.push": float(pushed.sum())}
    cost = PlanCost(link_bytes=links, sent_bytes=sent.tolist(),
                    ps_bytes=(pulled + pushed).tolist() if supply is not None else [],
                    held_bytes=held.tolist(), link_gbps=link_gbps,
                    seconds=float((sent + pulled + pushed).max() / bps))
    return ShardingPlan(world, ranks_per_node, {t.name: chosen[t.name] for t in tables}, cost,
                        {t.name: "pinned" if t.name in pins else "planner" for t in tables})
