"""Capacity planning: replay a config's ID trace and simulate device-cache hit rates per policy.

``simulate`` runs one policy at one capacity over a trace of per-batch unique dense IDs;
``belady_hit_rate`` and ``popularity_oracle_hit_rate`` are the offline bounds; ``run_plan`` is
``cosparse plan``. Semantics (batch granularity, pinning, how prefetched rows count) are in
``cosparse.tune.cache_sim``. The simulators import no torch; ``run_plan`` and ``build_traces``
(which read data) are imported on first use.
"""

from typing import Any

from cosparse.tune.cache_sim import POLICIES, CacheSimulator, compulsory_miss_rate, simulate
from cosparse.tune.oracles import belady_hit_rate, popularity_oracle_hit_rate
from cosparse.tune.plan import DEFAULT_CAPACITIES, default_policies, plan_tables, plan_to_json
from cosparse.tune.types import SimResult, TablePlan, Trace

__all__ = [
    "DEFAULT_CAPACITIES",
    "POLICIES",
    "CacheSimulator",
    "SimResult",
    "TablePlan",
    "Trace",
    "belady_hit_rate",
    "build_traces",
    "compulsory_miss_rate",
    "default_policies",
    "plan_tables",
    "plan_to_json",
    "popularity_oracle_hit_rate",
    "run_plan",
    "simulate",
]


def __getattr__(name: str) -> Any:
    if name == "run_plan":
        from cosparse.tune.run import run_plan

        return run_plan
    if name == "build_traces":
        from cosparse.tune.trace import build_traces

        return build_traces
    raise AttributeError(f"module 'cosparse.tune' has no attribute {name!r}")
