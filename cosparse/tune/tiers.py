"""Capacity planning for every tier: device and host rows per table under byte budgets, the
hit rate each tier will reach, the PS traffic per step, and the PS shards and memory to hold
every row, all from the capacity planner's simulator replaying the workload's ID trace.

The model (an inclusive hierarchy, as the engine's tiers are):
- the device tier is a cache of ``device_rows`` over the trace: its hit rate is simulated;
- the device and host tiers together hold ``host_rows`` rows (the host tier holds the device's
  rows too), so the rows found in either are a cache of ``host_rows``: the host tier's hit rate
  is that cache's less the device's;
- every other unique row of a batch is pulled from the PS (with its optimizer state, its ID and
  version on the wire), and every host eviction is a row written back to it.

The engine's planner picks victims by the policy alone unless ``supply.horizon`` tells it the
batches ahead; the lookahead only pins rows. So with no horizon the tiers are simulated on demand
(lookahead 0, where the simulator matches the engine's LRU within a point), with one at the
run's lookahead (the simulator then also orders victims by next use, as a horizon does).

Rates are measured once the tiers have warmed up: on the trace's second half (the simulation of
the first half subtracted from the whole's). Sizes are fractions of each table's distinct IDs,
the same fraction for every table, the smallest that reaches within ``KNEE`` of the hit rate the
whole budget buys (a tier that stops paying is not filled).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from cosparse.config import Config, TableConfig
from cosparse.optim import SparseOptimizer
from cosparse.tune.cache_sim import CacheSimulator
from cosparse.tune.types import SimResult, Trace

POLICIES = ("lru", "lfu", "hotness")
KNEE = 0.005  # hit-rate points a smaller tier may give up against the whole budget's
SHARES = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)
HEADER_BYTES = 32 + 3 * 24  # a request's frame header and array descriptors (cosparse.ps.protocol)
INDEX_BYTES_PER_ROW = 8 + 8 + 24  # a PS row's ID, version and hash-map slot, beside its values


@dataclass
class TableTiers:
    """One table's recommendation and what it predicts, per step on the warm trace."""

    table: str
    distinct_ids: int
    row_bytes: int  # values and optimizer state
    device_rows: int
    device_policy: str
    host_rows: int
    host_policy: str
    hit_rate_device: float
    hit_rate_host: float  # share of all lookups served by the host tier
    ps_rows_pulled_per_step: float
    ps_rows_written_per_step: float
    ps_bytes_per_step: float


@dataclass
class TierPlanReport:
    """The whole workload's recommendation (``cosparse plan --tiers``)."""

    tables: list[TableTiers]
    device_bytes: int
    host_bytes: int
    hit_rate_device: float
    hit_rate_host: float
    ps_bytes_per_step: float
    ps_rows: int
    ps_memory_bytes: int
    ps_shards: int
    lookahead: int

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "store": self.store()}

    def store(self) -> dict[str, Any]:
        """A ``store`` block that applies it: ``rows`` sizes every table alike, so each tier
        takes the largest table's rows, under its most chosen policy."""
        def most(policies: list[str]) -> str:
            return max(sorted(set(policies)), key=policies.count)

        return {"device": {"rows": max(t.device_rows for t in self.tables),
                           "policy": most([t.device_policy for t in self.tables])},
                "host": {"rows": max(t.host_rows for t in self.tables),
                         "policy": most([t.host_policy for t in self.tables])},
                "remote": {"num_shards": self.ps_shards}}


def row_bytes(table: TableConfig) -> int:
    opt = SparseOptimizer(table.optimizer)
    return 4 * (table.dim + opt.state_width(table.dim))


class _Warm:
    """One trace's simulations measured on its second half."""

    def __init__(self, trace: Trace) -> None:
        self.whole = CacheSimulator(trace)
        half = trace.num_batches // 2
        first = Trace(trace.ids[: trace.offsets[half]], trace.offsets[: half + 1], trace.num_ids)
        self.first = CacheSimulator(first) if half else None
        self.batches = trace.num_batches - half
        self.max_unique = trace.max_unique

    def run(self, rows: int, policy: str, lookahead: int) -> tuple[float, float, float]:
        """(hit rate, fetches per step, evictions per step) on the warm half. The hit rate is
        the engine's: the share of a batch's unique rows already in the tier when the batch is
        planned, so a row the planner brings in ahead is a miss (1 - the fetch rate)."""
        rows = max(rows, self.max_unique, 1)
        r = self.whole.run(rows, policy, lookahead)
        w = self.first.run(rows, policy, lookahead) if self.first is not None else \
            SimResult(policy, rows, lookahead, True)
        lookups, fetches = r.lookups - w.lookups, r.fetches - w.fetches
        return (1.0 - fetches / lookups if lookups else 0.0, fetches / self.batches,
                (r.evictions - w.evictions) / self.batches)


def _best(sim: _Warm, rows: int, policies: tuple[str, ...], lookahead: int
          ) -> tuple[str, tuple[float, float, float]]:
    return max(((p, sim.run(rows, p, lookahead)) for p in policies), key=lambda x: x[1][0])


def _knee(sims: list[_Warm], traces: list[Trace], limit: float, policies: tuple[str, ...],
          lookahead: int) -> float:
    """The smallest share (<= ``limit``) whose overall hit rate is within ``KNEE`` of the
    hit rate at ``limit``."""
    def overall(share: float) -> float:
        hits = lookups = 0.0
        for sim, tr in zip(sims, traces, strict=True):
            rate = _best(sim, math.ceil(share * tr.num_ids), policies, lookahead)[1][0]
            n = tr.lookups
            hits, lookups = hits + rate * n, lookups + n
        return hits / lookups if lookups else 0.0

    top = overall(limit)
    for share in [s for s in SHARES if s < limit]:
        if overall(share) >= top - KNEE:
            return share
    return limit


def plan_tiers(cfg: Config, traces: list[Trace], device_budget: int, host_budget: int | None,
               ps_shard_bytes: int, policies: tuple[str, ...] | None = None) -> TierPlanReport:
    """Recommend each table's device and host rows within the byte budgets (host None: no
    host budget, every row fits), and predict per-tier hit rates and the PS traffic."""
    lookahead = cfg.supply.lookahead if cfg.supply.horizon else 0
    tables = {t.name: t for t in cfg.tables}
    sims = [_Warm(tr) for tr in traces]
    widths = [row_bytes(tables[tr.name]) for tr in traces]
    every = sum(tr.num_ids * w for tr, w in zip(traces, widths, strict=True))
    if every == 0:
        raise ValueError("the trace holds no IDs: nothing to plan")
    device_limit = min(1.0, device_budget / every)
    host_limit = 1.0 if host_budget is None else min(1.0, host_budget / every)
    if host_limit < device_limit:
        raise ValueError(f"the host budget ({host_budget} bytes) is below the device budget "
                         f"({device_budget}): the host tier holds the device's rows too")
    dev_policies = policies or POLICIES
    dev_share = _knee(sims, traces, device_limit, dev_policies, lookahead)
    host_share = max(dev_share, _knee(sims, traces, host_limit, dev_policies, lookahead))
    out = []
    for sim, tr, width in zip(sims, traces, widths, strict=True):
        d_rows = max(math.ceil(dev_share * tr.num_ids), tr.max_unique)
        h_rows = max(math.ceil(host_share * tr.num_ids), d_rows)
        d_policy, (d_hit, _, _) = _best(sim, d_rows, dev_policies, lookahead)
        h_policy, (both, pulled, written) = _best(sim, h_rows, dev_policies, lookahead)
        if cfg.supply.path == "resident":  # no PS: a row first seen is made here
            pulled = written = 0.0
        shards = max(1, cfg.store.remote.num_shards)
        requests = 2 * shards if pulled or written else 0
        wire = (pulled * (8 + width + 8) + written * (8 + width) + requests * HEADER_BYTES)
        out.append(TableTiers(
            tr.name, tr.num_ids, width, d_rows, d_policy, h_rows, h_policy, d_hit,
            max(0.0, both - d_hit), pulled, written, wire))
    lookups = sum(tr.lookups for tr in traces)
    ps_rows = sum(t.distinct_ids for t in out)
    ps_memory = sum(t.distinct_ids * (t.row_bytes + INDEX_BYTES_PER_ROW) for t in out)
    return TierPlanReport(
        tables=out,
        device_bytes=sum(t.device_rows * t.row_bytes for t in out),
        host_bytes=sum(t.host_rows * t.row_bytes for t in out),
        hit_rate_device=sum(t.hit_rate_device * tr.lookups for t, tr in
                            zip(out, traces, strict=True)) / lookups,
        hit_rate_host=sum(t.hit_rate_host * tr.lookups for t, tr in
                          zip(out, traces, strict=True)) / lookups,
        ps_bytes_per_step=sum(t.ps_bytes_per_step for t in out),
        ps_rows=ps_rows, ps_memory_bytes=ps_memory,
        ps_shards=max(1, math.ceil(ps_memory / ps_shard_bytes)), lookahead=lookahead)


def drift(before: TierPlanReport, after: TierPlanReport) -> dict[str, Any]:
    """How the recommendation moves from one trace (last week) to another (this week)."""
    rows = {}
    old = {t.table: t for t in before.tables}
    for t in after.tables:
        o = old.get(t.table)
        rows[t.table] = {
            "distinct_ids": [o.distinct_ids if o else None, t.distinct_ids],
            "device_rows": [o.device_rows if o else None, t.device_rows],
            "host_rows": [o.host_rows if o else None, t.host_rows],
            "hit_rate_device": [o.hit_rate_device if o else None, t.hit_rate_device],
        }
    return {"tables": rows,
            "device_bytes": [before.device_bytes, after.device_bytes],
            "host_bytes": [before.host_bytes, after.host_bytes],
            "hit_rate_device": [before.hit_rate_device, after.hit_rate_device],
            "ps_bytes_per_step": [before.ps_bytes_per_step, after.ps_bytes_per_step],
            "ps_shards": [before.ps_shards, after.ps_shards]}


def describe(rep: TierPlanReport) -> str:
    """The recommendation as a table, one line per table, then the totals."""
    lines = [f"{'table':<12} {'distinct':>9} {'device rows':>12} {'policy':>8} {'host rows':>10} "
             f"{'policy':>8} {'hit dev':>8} {'hit host':>9} {'PS B/step':>11}"]
    for t in rep.tables:
        lines.append(f"{t.table:<12} {t.distinct_ids:>9,} {t.device_rows:>12,} "
                     f"{t.device_policy:>8} {t.host_rows:>10,} {t.host_policy:>8} "
                     f"{t.hit_rate_device:>8.3f} {t.hit_rate_host:>9.3f} "
                     f"{t.ps_bytes_per_step:>11,.0f}")
    lines.append(f"device {rep.device_bytes / 2**20:,.1f} MiB, host {rep.host_bytes / 2**20:,.1f} "
                 f"MiB; hit rate device {rep.hit_rate_device:.3f}, host {rep.hit_rate_host:.3f}; "
                 f"PS {rep.ps_bytes_per_step:,.0f} bytes/step, {rep.ps_rows:,} rows in "
                 f"{rep.ps_memory_bytes / 2**20:,.1f} MiB on {rep.ps_shards} shard(s)")
    return "\n".join(lines)
