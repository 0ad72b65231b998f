"""Batch-granular device-cache simulation of one table's ID trace, for every placement policy.

The model (it matches the engine's planner and its ``hit_rate.device`` counter)
-------------------------------------------------------------------------------
The trace is a sequence of batches; ``U_t`` is the set of unique rows of batch ``t``. The cache holds
at most ``C`` rows. Batch ``t`` is processed in three steps:

1. **Count.** ``hits_t = |U_t ∩ R_t|`` where ``R_t`` is the cache *at the start of batch t*.
   ``hit_rate = Σ hits_t / Σ |U_t|``; ``hit_rate_warm`` is the same sum over the batches after the
   first 10% (``warmup_batches = num_batches // 10``). Then the history of every row of ``U_t`` is
   updated (last use, count, decayed hotness, next use). History is kept for all IDs, resident or
   not, across evictions.
2. **Window.** With lookahead ``k`` the window is ``W_t = U_t ∪ U_{t+1} ∪ … ∪ U_{t+k'}`` with the
   largest ``k' <= k`` (clipped at the end of the trace) such that ``|W_t| <= C``. When ``k' < k`` for
   lack of room the window was *shrunk* and ``shrinks`` counts the step. With ``k = 0``, ``W_t = U_t``.
   ``C >= max_t |U_t|`` is required: a smaller capacity is *infeasible* (reported, not simulated).
3. **Fill.** Every row of ``W_t`` not resident is fetched (``fetches`` counts them): the misses of
   ``U_t`` on demand, the rows of ``U_{t+1..t+k'}`` as prefetches. Each fetch into a full cache
   evicts one victim. Rows of ``W_t`` are **pinned**: never victims. Victims are taken, in order:
   (a) unpinned rows whose next use is not known to the window (beyond ``t+k``), lowest policy
   priority first; (b) only after a shrink: rows needed by batches ``t+k'+1..t+k`` (known to the
   full window, not pinned), farthest next use first. Priority ties go to the smaller dense ID.

How prefetching counts
----------------------
A prefetched row is resident at the start of its batch, so it **counts as a hit** (that is the
point of lookahead). With ``k >= 1`` and no shrinks, every batch after the first is therefore all
hits, whatever the policy: ``hit_rate`` then measures only whether the window fits. What separates
policies under prefetching is the traffic, ``fetch_rate = fetches / Σ|U_t|`` (rows moved into the
tier per lookup), which equals ``1 - hit_rate`` under demand fetching (``k = 0``). The planner
reports both.

Policies (each a priority; the victim is the lowest)
----------------------------------------------------
- ``lru``: the batch of the last use (exact LRU at batch granularity).
- ``lfu``: the number of batches the row appeared in so far.
- ``hotness``: decayed frequency ``Σ decay^(t_now - t_use)`` over past uses (``decay`` per batch,
  default 0.99), computed in the log domain so that it never overflows.
- ``lookahead`` (``lookahead-k``): ``hotness`` with lookahead ``k`` (pinning, next-use order inside
  the window after a shrink, and prefetching of the window).
- ``belady``: Belady's offline MIN at batch granularity, the next use (farthest first; never again is
  infinitely far). With ``k = 0`` it is the optimum of demand fetching: no policy that fetches on
  demand gets more hits from a cache of ``C`` rows. ``belady`` with lookahead ``k``
  (``belady_prefetch_k``) uses the same window, pinning and prefetch rules as ``lookahead-k`` and
  is its apples-to-apples bound: it needs the fewest fetches of any policy under those rules (the
  next use orders rows by the step at which the window first forces them in, so the exchange
  argument of MIN still holds).
- ``popularity_oracle``: the static oracle. Rows are ranked once by their total count of batches
  over the whole trace (future included); the priority is that count. The cache therefore holds each
  batch's rows (with lookahead: the window's rows) plus, in the remaining slots, the most popular
  rows of the whole trace among those already fetched. Rows enter only on demand or by prefetch, so
  its compulsory misses are those of every other policy; with ``C >= all IDs`` nothing is evicted.

Any policy accepts a lookahead; ``<policy>_prefetch_k`` names it in reports (``lookahead-k`` for
hotness).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

from cosparse.tune import kernels as K
from cosparse.tune.types import SimResult, Trace

POLICIES: dict[str, int] = {
    "lru": K.LRU,
    "lfu": K.LFU,
    "hotness": K.HOTNESS,
    "lookahead": K.HOTNESS,
    "belady": K.BELADY,
    "popularity_oracle": K.STATIC,
}
DEFAULT_DECAY = 0.99


def parse_policy(name: str, lookahead: int = 0) -> tuple[str, int]:
    """``"lookahead-4"`` -> ("lookahead", 4); ``"belady_prefetch_2"`` -> ("belady", 2);
    a bare name keeps ``lookahead``. Raises ValueError for unknown names."""
    base, k = name, lookahead
    if m := re.fullmatch(r"lookahead-(\d+)", name):
        base, k = "lookahead", int(m.group(1))
    elif m := re.fullmatch(r"([a-z_]+?)_prefetch_(\d+)", name):
        base, k = m.group(1), int(m.group(2))
    if base not in POLICIES:
        raise ValueError(f"unknown cache policy {name!r}; known: {', '.join(POLICIES)} "
                         "(and lookahead-K, <policy>_prefetch_K)")
    if k < 0:
        raise ValueError("lookahead must be >= 0")
    return base, k


def report_name(policy: str, lookahead: int) -> str:
    """The name used in tables and JSON: ``lru``, ``lookahead-4``, ``belady_prefetch_4``."""
    if policy in ("lookahead", "hotness") and lookahead > 0:
        return f"lookahead-{lookahead}"
    return policy if lookahead == 0 else f"{policy}_prefetch_{lookahead}"


def as_trace(trace: Trace | Sequence[np.ndarray], num_ids: int | None = None) -> Trace:
    if isinstance(trace, Trace):
        return trace
    return Trace.from_batches(list(trace), num_ids)


class CacheSimulator:
    """One trace, prepared once (next uses, window sizes, total counts), simulated many times.

    ``run`` releases the GIL in its kernel, so several runs may go on threads at once.
    """

    def __init__(self, trace: Trace | Sequence[np.ndarray], num_ids: int | None = None) -> None:
        self.trace = as_trace(trace, num_ids)
        tr = self.trace
        self.max_unique = tr.max_unique
        self.nxt, self.first = K.next_use(tr.ids, tr.offsets, tr.num_ids)
        self._ws: dict[int, np.ndarray] = {}
        self._counts: np.ndarray | None = None

    @property
    def warmup_batches(self) -> int:
        return self.trace.num_batches // 10

    def window_sizes(self, k: int) -> np.ndarray:
        if k not in self._ws:
            tr = self.trace
            self._ws[k] = K.window_sizes(tr.ids, tr.offsets, tr.num_ids, k)
        return self._ws[k]

    def total_counts(self) -> np.ndarray:
        """Batches each row appears in over the whole trace (the popularity oracle's ranking)."""
        if self._counts is None:
            tr = self.trace
            self._counts = np.bincount(tr.ids, minlength=tr.num_ids).astype(np.float64)
        return self._counts

    def run(self, capacity: int, policy: str, lookahead: int = 0,
            decay: float = DEFAULT_DECAY) -> SimResult:
        """Simulate ``policy`` (a name ``parse_policy`` accepts) with a cache of ``capacity`` rows."""
        base, k = parse_policy(policy, lookahead)
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        capacity = int(capacity)
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        tr = self.trace
        result = SimResult(policy=report_name(base, k), capacity=capacity, lookahead=k,
                           feasible=capacity >= max(self.max_unique, 1),
                           warmup_batches=self.warmup_batches)
        if not result.feasible:
            return result
        code = POLICIES[base]
        static = self.total_counts() if code == K.STATIC else np.zeros(1, dtype=np.float64)
        stats = K.simulate_cache(tr.ids, tr.offsets, self.nxt, self.first, self.window_sizes(k),
                                 tr.num_ids, capacity, code, k, float(decay), static,
                                 self.warmup_batches)
        for name, value in zip(K.STAT_NAMES, stats.tolist(), strict=True):
            setattr(result, name, int(value))
        return result


def simulate(
    trace: Trace | Sequence[np.ndarray],
    num_ids: int,
    capacity: int,
    policy: str,
    lookahead: int = 0,
    decay: float = DEFAULT_DECAY,
) -> SimResult:
    """Simulate a ``capacity``-row cache under ``policy`` over ``trace``.

    trace: per batch, the unique dense row IDs (0..num_ids-1) of one table, in batch order.
    policy: ``lru | lfu | hotness | lookahead | belady | popularity_oracle`` (or ``lookahead-K``,
    ``<policy>_prefetch_K``, which set the lookahead). See the module docstring for the semantics.
    """
    return CacheSimulator(trace, num_ids).run(capacity, policy, lookahead, decay)


def compulsory_miss_rate(trace: Trace | Sequence[np.ndarray], num_ids: int | None = None) -> float:
    """Distinct IDs / lookups: the misses no demand-fetching cache avoids."""
    tr = as_trace(trace, num_ids)
    distinct = int(np.unique(tr.ids).shape[0])
    return distinct / tr.lookups if tr.lookups else math.nan
