"""Live health of a run, judged every interval: is each device cache earning its keep, does the
trainer wait on the planner, do B's delivered rows go stale, did the supply path fall back.

The hit-rate bound
------------------
For each cached table, the best device hit rate any cache of the same capacity could have had on
the same batches, under the same lookahead and pinning rules: Belady's MIN with the engine's
window, pins and prefetches (``cosparse.tune.cache_sim``, ``belady`` at lookahead ``k``). The
engine counts a row as a device hit when it is resident as its batch is planned, so the bound is
the simulation's no-transfer fraction ``1 - fetches / lookups``.

It is computed off the critical path, on a background thread, from a sample of the recent trace:
each batch's unique rows whose hash falls in ``1 / SAMPLE_RATE`` of the hash space, with the
capacity scaled by the same rate (spatial sampling, as SHARDS: Waldspurger et al., FAST '15), over
the last ``train.health.bound_sample_steps`` batches. The batches before the interval warm the
simulated cache up: the bound counts only the interval's own batches (the fetches of the whole
sample less those of the sample without the interval). The result of one interval's computation is
reported with the first interval after it has finished, beside the engine's hit rate over the
same batches (the interval it was computed for); while one computation runs, the intervals that
end are not sent off.

``hit_rate.device_over_bound.<table>`` is the engine's hit rate over the bound (1.0: as good as
any cache of that size can be), and ``hit_rate.device_over_bound`` the lowest over the tables.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cosparse.config.train import HealthConfig
from cosparse.tune.cache_sim import CacheSimulator
from cosparse.tune.types import Trace

SAMPLE_RATE = 8  # one row in this many (by hash) is simulated
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def sampled(ids: np.ndarray) -> np.ndarray:
    """The rows of ``ids`` in the sample: those whose multiplicative hash's top bits are 0."""
    h = ids.astype(np.uint64, copy=False) * _GOLDEN  # (wraps: a multiplicative hash)
    return ids[(h >> np.uint64(61)) == 0]


@dataclass
class _Interval:
    """What one interval's bound is computed from: each table's sampled batches (the interval's
    last ``fresh``) and its device capacity."""

    batches: dict[str, list[np.ndarray]]
    fresh: int
    capacity: dict[str, int]


def hit_rate_bound(batches: list[np.ndarray], fresh: int, capacity: int, lookahead: int
                   ) -> float | None:
    """The best no-transfer fraction over the last ``fresh`` of ``batches`` (sampled unique rows
    per batch) for a cache of ``capacity`` sampled rows; None when nothing can be said."""
    if not batches or fresh <= 0:
        return None
    ids = np.concatenate(batches)
    if not ids.shape[0]:
        return None
    dense_ids, inverse = np.unique(ids, return_inverse=True)
    offsets = np.zeros(len(batches) + 1, dtype=np.int64)
    np.cumsum([b.shape[0] for b in batches], out=offsets[1:])
    trace = Trace(inverse.astype(np.int64), offsets, int(dense_ids.shape[0]))
    cap = max(capacity, trace.max_unique)  # (sampling may leave one batch over the scaled size)
    whole = CacheSimulator(trace).run(cap, "belady", lookahead)
    warm = len(batches) - fresh
    before = 0
    if warm > 0:
        head = Trace(trace.ids[: offsets[warm]], offsets[: warm + 1], trace.num_ids)
        before = CacheSimulator(head).run(cap, "belady", lookahead).fetches
    lookups = int(offsets[-1] - offsets[warm])
    if not lookups:
        return None
    return max(0.0, 1.0 - (whole.fetches - before) / lookups)


class HealthMonitor:
    """Collects the sample every step and judges every interval; warnings go to ``log`` and to
    the interval's record (``health.warnings``). The hit-rate warning comes when a table has been
    below the floor for ``intervals_below`` intervals in a row; the wait and stale-drop warnings
    when their share first goes over its threshold (again only after it fell back under); a
    fallback whenever one happened."""

    def __init__(self, cfg: HealthConfig, lookahead: int, log: Callable[[str], None]) -> None:
        self.cfg, self.lookahead, self.log = cfg, lookahead, log
        self._recent: dict[str, collections.deque[np.ndarray]] = {}
        self._fresh = 0
        # the bound being computed: its thread, its results, the engine's hit rates it is for
        self._pending: tuple[threading.Thread, dict[str, float | None],
                             dict[str, float | None]] | None = None
        self._below: dict[str, int] = {}
        self._fallbacks = 0.0
        self._raised: set[str] = set()  # the wait and stale warnings now standing

    def observe(self, uniques: dict[str, np.ndarray]) -> None:
        """One trained batch: each cached table's unique rows (sampled here)."""
        for name, u in uniques.items():
            q = self._recent.get(name)
            if q is None:
                q = self._recent[name] = collections.deque(maxlen=self.cfg.bound_sample_steps)
            q.append(sampled(u))
        self._fresh += 1

    def _start_bound(self, capacity: dict[str, int], engine: dict[str, float | None]) -> None:
        job = _Interval({n: list(q) for n, q in self._recent.items()}, self._fresh, capacity)
        out: dict[str, float | None] = {}

        def run() -> None:
            for name, batches in job.batches.items():
                cap = job.capacity.get(name)
                if cap is not None:
                    out[name] = hit_rate_bound(batches, min(job.fresh, len(batches)),
                                               max(1, cap // SAMPLE_RATE), self.lookahead)

        t = threading.Thread(target=run, name="cosparse-hit-rate-bound", daemon=True)
        t.start()
        self._pending = (t, out, engine)

    def judge(self, rec: dict[str, Any], capacity: dict[str, int]) -> dict[str, Any]:
        """The health figures and warnings of the interval ``rec`` (its metrics record);
        ``capacity``: each cached table's device rows now."""
        out: dict[str, Any] = {}
        warnings: list[str] = []
        bounds = self._take_bounds()
        if bounds is not None:
            ratios = {}
            for name, (bound, engine) in bounds.items():
                if bound is None or engine is None or bound <= 0:
                    continue
                ratios[name] = engine / bound
                out[f"hit_rate.bound.{name}"] = bound
                out[f"hit_rate.device_over_bound.{name}"] = ratios[name]
            if ratios:
                out["hit_rate.device_over_bound"] = min(ratios.values())
            warnings += self._floor(ratios)
        if self._recent and self._pending is None:  # this interval's bound, reported later
            self._start_bound(capacity, {n: rec.get(f"hit_rate.device.{n}") for n in self._recent})
        self._fresh = 0
        warnings += self._waits_and_supply(rec)
        if warnings:
            out["health.warnings"] = warnings
            for w in warnings:
                self.log(f"health warning at step {rec.get('step')}: {w}")
        return out

    def _take_bounds(self) -> dict[str, tuple[float | None, float | None]] | None:
        """The bounds of the interval last sent off, with the engine's hit rates then, once their
        thread has finished (none is waited for: while one runs, no other interval's starts)."""
        if self._pending is None or self._pending[0].is_alive():
            return None
        _, out, engine = self._pending
        self._pending = None
        return {n: (b, engine.get(n)) for n, b in out.items()}

    def _floor(self, ratios: dict[str, float]) -> list[str]:
        out = []
        for name, r in ratios.items():
            self._below[name] = self._below.get(name, 0) + 1 if r < self.cfg.hit_rate_floor else 0
            if self._below[name] == self.cfg.intervals_below:
                out.append(f"table '{name}': the device hit rate has stayed at {r:.2f} of the best "
                           f"achievable for its capacity for {self._below[name]} intervals "
                           f"(train.health.hit_rate_floor {self.cfg.hit_rate_floor:g}): a cache "
                           "that exists but whose hit rate does not rise (try another "
                           "store.device.policy, or `cosparse plan` for the capacity)")
        return out

    def _waits_and_supply(self, rec: dict[str, Any]) -> list[str]:
        out = []
        wait = rec.get("stage_ms.read")
        steps_ms = sum(v for k, v in rec.items() if k.startswith("stage_ms.")
                       and isinstance(v, float))
        share = wait / steps_ms if wait is not None and steps_ms > 0 else 0.0
        if self._rises("wait", share > self.cfg.planner_wait_share):
            out.append(f"the trainer waited for its batches (prefetch, planner, data workers) "
                       f"{wait / steps_ms:.0%} of its step time (train.health.planner_wait_share "
                       f"{self.cfg.planner_wait_share:g}): raise supply.lookahead or data.workers")
        delivered, stale = rec.get("delivered_rows"), rec.get("stale_drops")
        rate = stale / delivered if delivered and stale is not None else 0.0
        if self._rises("stale", rate > self.cfg.stale_drop_rate):
            out.append(f"{stale:.0f} of {delivered:.0f} delivered rows were stale "
                       f"({stale / delivered:.1%} > train.health.stale_drop_rate "
                       f"{self.cfg.stale_drop_rate:g}): publish the filter more often "
                       "(supply.publish_every)")
        falls = rec.get("fallbacks")
        if falls is not None and falls > self._fallbacks:
            out.append(f"the supply path fell back ({falls:.0f} fallbacks in the run)")
            self._fallbacks = falls
        return out

    def _rises(self, key: str, above: bool) -> bool:
        """True when ``key`` goes above its threshold: said once, again only after it fell."""
        was = key in self._raised
        if above:
            self._raised.add(key)
        else:
            self._raised.discard(key)
        return above and not was

    def close(self) -> None:
        if self._pending is not None:
            self._pending[0].join(timeout=30.0)
            self._pending = None
