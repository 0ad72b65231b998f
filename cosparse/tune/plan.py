"""Capacity-planning curves: every policy at every capacity for every table, and their JSON form.

Capacities are fractions of a table's distinct IDs in the trace (``0.05`` = 5%), or absolute row
counts when greater than 1. Simulations run on threads (their kernels release the GIL).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tqdm import tqdm

from cosparse.tune.cache_sim import DEFAULT_DECAY, CacheSimulator, parse_policy
from cosparse.tune.types import SimResult, TablePlan, Trace

DEFAULT_CAPACITIES: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
DEFINITION = (
    "hit_rate = sum_t |U_t & cache at start of batch t| / sum_t |U_t| (U_t: unique rows of batch t); "
    "prefetched rows count as hits; hit_rate_warm leaves out the first 10% of batches; "
    "fetch_rate = rows fetched into the cache (demand + prefetch) / sum_t |U_t|; "
    "see cosparse/tune/cache_sim.py"
)


def default_policies(lookahead: int) -> list[str]:
    """The demand policies and bounds, then (with ``lookahead > 0``) the prefetching pair."""
    names = ["lru", "lfu", "hotness", "popularity_oracle", "belady"]
    if lookahead > 0:
        names += [f"lookahead-{lookahead}", f"belady_prefetch_{lookahead}"]
    return names


def capacity_rows(capacity: float, num_ids: int) -> int:
    """Rows of a capacity: a fraction of ``num_ids`` when <= 1, else an absolute row count."""
    if capacity <= 0:
        raise ValueError(f"capacity must be positive, got {capacity}")
    if capacity > 1:
        return int(capacity)
    return max(1, int(round(capacity * num_ids)))


def plan_tables(
    traces: Sequence[Trace],
    capacities: Sequence[float] = DEFAULT_CAPACITIES,
    policies: Sequence[str] | None = None,
    lookahead: int = 4,
    decay: float = DEFAULT_DECAY,
    threads: int | None = None,
    progress: bool = True,
) -> list[TablePlan]:
    """Simulate every (table, capacity, policy)."""
    policies = list(policies) if policies is not None else default_policies(lookahead)
    parsed = [parse_policy(p) for p in policies]  # names carry their lookahead
    plans: list[TablePlan] = []
    jobs: list[tuple[TablePlan, CacheSimulator, str, int, int]] = []
    for tr in traces:
        sim = CacheSimulator(tr)
        for _, k in parsed:  # prepare on this thread, before the pool shares the simulator
            sim.window_sizes(k)
        sim.total_counts()
        rows = [capacity_rows(c, tr.num_ids) for c in capacities]
        tp = TablePlan(tr.name, tr.num_ids, tr.lookups, tr.num_batches, tr.max_unique,
                       list(capacities), rows)
        plans.append(tp)
        for name, (_, k) in zip(policies, parsed, strict=True):
            tp.results[name] = []
            for r in rows:
                jobs.append((tp, sim, name, k, r))
    workers = threads or max(1, min(len(jobs), os.cpu_count() or 1))
    bar = tqdm(total=len(jobs), desc="simulate", unit="run", file=sys.stderr, disable=not progress)

    def one(job: tuple[TablePlan, CacheSimulator, str, int, int]) -> SimResult:
        _, sim, name, k, r = job
        out = sim.run(r, name, k, decay)
        bar.update(1)
        return out

    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(one, jobs))
    bar.close()
    for (tp, _, name, _, _), res in zip(jobs, results, strict=True):
        tp.results[name].append(res)
    return plans


def overall(plans: Sequence[TablePlan]) -> dict[str, list[SimResult]]:
    """All tables together at each capacity (each table at its own rows): summed counters."""
    if not plans:
        return {}
    out: dict[str, list[SimResult]] = {}
    for name in plans[0].results:
        curve = []
        for ci in range(len(plans[0].capacities)):
            parts = [p.results[name][ci] for p in plans]
            s = SimResult(policy=parts[0].policy, capacity=sum(x.capacity for x in parts),
                          lookahead=parts[0].lookahead, feasible=all(x.feasible for x in parts))
            if s.feasible:
                for f in ("hits", "lookups", "hits_warm", "lookups_warm", "fetches", "evictions",
                          "shrinks"):
                    setattr(s, f, sum(getattr(x, f) for x in parts))
            curve.append(s)
        out[name] = curve
    return out


def _nan_to_none(x: float) -> float | None:
    return None if math.isnan(x) else x


def _curves(results: dict[str, list[SimResult]], capacities: Sequence[float],
            num_ids: int) -> dict[str, list[dict[str, Any]]]:
    return {
        name: [dict(capacity=c, fraction=r.capacity / num_ids if num_ids else None, **r.to_dict())
               for c, r in zip(capacities, curve, strict=True)]
        for name, curve in results.items()
    }


def plan_to_json(plans: Sequence[TablePlan], meta: dict[str, Any]) -> dict[str, Any]:
    """The ``plan.json`` document: meta, one entry per table and the overall curves."""
    tables = {}
    for p in plans:
        tables[p.name] = {
            "distinct_ids": p.num_ids, "lookups": p.lookups, "batches": p.num_batches,
            "max_unique_per_batch": p.max_unique,
            "min_feasible_fraction": p.max_unique / p.num_ids if p.num_ids else None,
            "compulsory_miss_rate": p.num_ids / p.lookups if p.lookups else None,
            "rows": p.rows,
            "curves": _curves(p.results, p.capacities, p.num_ids),
        }
    num_ids = sum(p.num_ids for p in plans)
    lookups = sum(p.lookups for p in plans)
    doc = dict(meta)
    doc.update(
        definition=DEFINITION,
        capacities=list(plans[0].capacities) if plans else [],
        policies=list(plans[0].results) if plans else [],
        tables=tables,
        overall={
            "distinct_ids": num_ids, "lookups": lookups,
            "compulsory_miss_rate": _nan_to_none(num_ids / lookups) if lookups else None,
            "curves": _curves(overall(plans), plans[0].capacities if plans else [], num_ids),
        },
    )
    return doc
