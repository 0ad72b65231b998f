"""Per-table hotness for the sharding planner, from the capacity planner's simulator: how many
of a batch's unique rows a cache holding a given share of the table's rows must fetch from
below, and how many it evicts, under the run's policy and lookahead.

The planner (``cosparse.parallel``, a sibling layer) takes it as an injected function, so that
the cost model itself stays plain arithmetic over plain data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from cosparse.config import Config, TableConfig
from cosparse.tune.cache_sim import CacheSimulator
from cosparse.tune.types import Trace

SHARES: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)

# (share of the distinct rows cached, fetches per unique row looked up, evictions per unique
# row looked up), shares ascending
Curve = tuple[tuple[float, float, float], ...]


def fetch_curve(batches: Sequence[np.ndarray], policy: str, lookahead: int,
                shares: Sequence[float] = SHARES) -> Curve:
    """The curve of one table over ``batches`` (each batch's unique row keys), measured on
    their second half, once the cache has warmed up (the whole run less its first half: the
    simulation of a prefix is that of the whole up to there). A share whose cache cannot hold
    one batch's rows is simulated at the smallest cache that can."""
    if not batches or not sum(b.shape[0] for b in batches):
        return ()
    keys, dense = np.unique(np.concatenate(batches), return_inverse=True)
    parts = np.split(dense.astype(np.int64), np.cumsum([b.shape[0] for b in batches])[:-1])
    n = keys.shape[0]
    whole = CacheSimulator(Trace.from_batches(parts, n))
    half = len(parts) // 2
    first = CacheSimulator(Trace.from_batches(parts[:half], n)) if half else None
    out = []
    for share in shares:
        rows = max(int(np.ceil(share * n)), whole.max_unique, 1)
        r = whole.run(rows, policy, lookahead)
        fetches, evictions, lookups = r.fetches, r.evictions, r.lookups
        if first is not None:
            w = first.run(rows, policy, lookahead)
            fetches, evictions, lookups = fetches - w.fetches, evictions - w.evictions, \
                lookups - w.lookups
        out.append((min(1.0, rows / n), fetches / max(lookups, 1), evictions / max(lookups, 1)))
    return tuple(out)


def table_hotness(cfg: Config) -> Callable[[TableConfig, list[np.ndarray]], Curve]:
    """The planner's hotness function for ``cfg``: each table under its own policy (or the
    device tier's) and the supply's lookahead."""

    def curve(table: TableConfig, batches: list[np.ndarray]) -> Curve:
        return fetch_curve(batches, table.policy or cfg.store.device.policy,
                           cfg.supply.lookahead)

    return curve
