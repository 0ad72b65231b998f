"""Plain data of the capacity planner: an ID trace, one simulation's result, one curve point."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Trace:
    """The unique dense row IDs of every batch of one table, as CSR.

    ids:      int64 [lookups] dense IDs 0..num_ids-1, batch after batch, unique within a batch.
    offsets:  int64 [num_batches + 1] batch ``t`` is ``ids[offsets[t]:offsets[t + 1]]``.
    num_ids:  distinct IDs in the whole trace (the dense ID space).
    name:     the table's name (informational).
    """

    ids: np.ndarray
    offsets: np.ndarray
    num_ids: int
    name: str = ""

    @property
    def num_batches(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def lookups(self) -> int:
        return int(self.ids.shape[0])

    @property
    def max_unique(self) -> int:
        """The largest batch (unique rows): the smallest feasible capacity."""
        return int(np.diff(self.offsets).max()) if self.num_batches else 0

    def batch(self, t: int) -> np.ndarray:
        return self.ids[self.offsets[t] : self.offsets[t + 1]]

    @classmethod
    def from_batches(cls, batches: list[np.ndarray], num_ids: int | None = None, name: str = "") -> Trace:
        """CSR of a list of per-batch unique dense-ID arrays."""
        sizes = np.array([b.shape[0] for b in batches], dtype=np.int64)
        offsets = np.zeros(len(batches) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        ids = (np.concatenate([np.asarray(b, dtype=np.int64) for b in batches])
               if batches else np.zeros(0, dtype=np.int64))
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        if num_ids is None:
            num_ids = int(ids.max()) + 1 if ids.shape[0] else 0
        if ids.shape[0] and (ids.min() < 0 or ids.max() >= num_ids):
            raise ValueError(f"trace IDs must lie in 0..{num_ids - 1}")
        return cls(ids, offsets, int(num_ids), name)


@dataclass
class SimResult:
    """One cache simulation (one policy, one capacity) over a trace.

    hits:       lookups whose row was resident at the start of its batch (prefetched rows count).
    lookups:    unique rows over all batches (sum of ``|U_t|``).
    hit_rate:   hits / lookups; NaN when infeasible.
    hit_rate_warm: the same, leaving out the first ``warmup_batches`` batches (10% of the trace).
    fetches:    rows brought into the cache (on demand or prefetched): the traffic into the tier.
    fetch_rate: fetches / lookups. Equal to 1 - hit_rate for demand fetching (lookahead 0).
    evictions:  rows evicted.
    shrinks:    steps whose lookahead window had to be shrunk to fit the capacity.
    feasible:   capacity >= the largest batch's unique rows; otherwise nothing was simulated.
    """

    policy: str
    capacity: int
    lookahead: int
    feasible: bool
    hits: int = 0
    lookups: int = 0
    hits_warm: int = 0
    lookups_warm: int = 0
    fetches: int = 0
    evictions: int = 0
    shrinks: int = 0
    warmup_batches: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.feasible and self.lookups else math.nan

    @property
    def hit_rate_warm(self) -> float:
        return self.hits_warm / self.lookups_warm if self.feasible and self.lookups_warm else math.nan

    @property
    def fetch_rate(self) -> float:
        return self.fetches / self.lookups if self.feasible and self.lookups else math.nan

    def to_dict(self) -> dict[str, object]:
        def num(x: float) -> float | None:
            return None if math.isnan(x) else x

        return {
            "policy": self.policy, "rows": self.capacity, "lookahead": self.lookahead,
            "feasible": self.feasible, "hit_rate": num(self.hit_rate),
            "hit_rate_warm": num(self.hit_rate_warm), "fetch_rate": num(self.fetch_rate),
            "hits": self.hits, "lookups": self.lookups, "fetches": self.fetches,
            "evictions": self.evictions, "shrinks": self.shrinks,
        }


@dataclass
class TablePlan:
    """The curves of one table: ``results[policy][i]`` is the simulation at ``rows[i]``."""

    name: str
    num_ids: int
    lookups: int
    num_batches: int
    max_unique: int
    capacities: list[float]
    rows: list[int]
    results: dict[str, list[SimResult]] = field(default_factory=dict)
