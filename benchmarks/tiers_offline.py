"""bench_tiers' offline passes: the planner alone over the batches (plan-only, optionally under
cProfile), the steady-state counters and engine figures, and the policies against Belady on the
ID traces."""

from __future__ import annotations

import cProfile
import io
import pstats
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import common
from benchmarks.tiers_worker import COUNTER_KEYS, LINKS, POLICIES, TiersConfig, build_ec, snapshot


# ---------------------------------------------------------------------------- plan-only passes
def plan_only(cfg: TiersConfig, sbs: list[Any], policy: str, profile: bool) -> dict[str, Any]:
    """dev10_host100 with device ``policy``: prepare + stage + mark_done per trained batch."""
    ec = build_ec(cfg, "dev10_host100", policy)
    snaps, plan_ms = {}, []
    pr = cProfile.Profile() if profile else None
    staged = ec.staged(sbs[: cfg.n_batches], cfg.horizon)  # the same source as the trainers
    for i in range(cfg.n_train):
        steady = i >= cfg.warmup
        if pr is not None and steady:
            pr.enable()
        p = next(staged)  # prepares the batch entering the horizon, plans batch i
        if pr is not None and steady:
            pr.disable()
        ec.planner.mark_done()
        snaps[i] = snapshot(ec)
        if steady:
            plan_ms.append(p.plan_ms)
    out: dict[str, Any] = {"snaps": snaps, "plan_ms": plan_ms, "hbm_share": ec.hbm_share()}
    if pr is not None:
        out["profile"] = profile_table(pr, cfg.n_train - cfg.warmup)
    return out


def profile_table(pr: cProfile.Profile, n: int, top: int = 15) -> dict[str, Any]:
    st = pstats.Stats(pr, stream=io.StringIO())
    rows = []
    for (fn, line, func), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        short = fn.split("/cosparse/")[-1] if "/cosparse/" in fn else Path(fn).name
        rows.append({"func": f"{short}:{line}({func})", "calls_per_batch": round(nc / n, 1),
                     "tottime_ms_per_batch": round(1e3 * tt / n, 2),
                     "cumtime_ms_per_batch": round(1e3 * ct / n, 2)})
    rows.sort(key=lambda r: -r["tottime_ms_per_batch"])
    total = sum(r["tottime_ms_per_batch"] for r in rows)
    return {"total_ms_per_batch": round(total, 2), "top_tottime": rows[:top]}


# ------------------------------------------------------------------------------- figures
def steady_counters(snaps: dict[Any, Any], cfg: TiersConfig) -> dict[str, dict[str, int]]:
    """Per table: counters summed over the steady batches [warmup, n_train)."""
    lo, hi = snaps.get(cfg.warmup - 1), snaps[cfg.n_train - 1]
    out = {}
    for t, c in hi["tables"].items():
        base = lo["tables"][t] if lo is not None else dict.fromkeys(c, 0)
        out[t] = {k: c[k] - base[k] for k in COUNTER_KEYS}
    return out


def engine_figures(snaps: dict[Any, Any], cfg: TiersConfig) -> dict[str, Any]:
    per = steady_counters(snaps, cfg)
    tot = {k: sum(p[k] for p in per.values()) for k in COUNTER_KEYS}
    n = cfg.n_train - cfg.warmup
    look = max(tot["lookups"], 1)
    lo = snaps.get(cfg.warmup - 1, {"shrinks": 0})["shrinks"]
    return {
        "hit_rate_device": tot["device_hits"] / look,
        "hit_rate_host": tot["host_hits"] / look,
        "hit_rate_backing": tot["backing_hits"] / look,
        "host_hits_over_device_misses": tot["host_hits"] / max(look - tot["device_hits"], 1),
        "fresh_rows_per_lookup": tot["fresh_rows"] / look,
        "hit_rate_device_per_table": {t: round(p["device_hits"] / max(p["lookups"], 1), 4)
                                      for t, p in per.items()},
        "unique_ids_per_table_per_batch": round(tot["lookups"] / n / max(len(per), 1)),
        "bytes_per_batch": {link: round(tot[k] / n) for link, k in LINKS.items()},
        "bytes_total_steady": {link: tot[k] for link, k in LINKS.items()},
        "evictions_per_batch": {"device": round(tot["evictions_device"] / n, 1),
                                "host": round(tot["evictions_host"] / n, 1)},
        "writebacks_device_per_batch": round(tot["writebacks_device"] / n, 1),
        "lookahead_shrinks": snaps[cfg.n_train - 1]["shrinks"] - lo,
        "steady_batches": n,
        "counters_steady": tot,
    }


def build_traces(cfg: TiersConfig, raw: list[common.Batch]) -> list[tuple[list[np.ndarray], int]]:
    """Per table: the unique IDs of each trained batch, mapped to dense ints 0..V-1, and V."""
    per_table: list[list[np.ndarray]] = [[] for _ in range(cfg.tables)]
    for b in raw[: cfg.n_train]:
        lens = b["lengths"].reshape(cfg.tables, cfg.batch).sum(axis=1)
        off = np.concatenate([[0], np.cumsum(lens)])
        for f in range(cfg.tables):
            per_table[f].append(np.unique(b["values"][off[f]:off[f + 1]]))
    out = []
    for us in per_table:
        vocab = np.unique(np.concatenate(us))
        out.append(([np.searchsorted(vocab, u).astype(np.int64) for u in us], int(vocab.shape[0])))
    return out


def simulate_all(cfg: TiersConfig, traces: list[tuple[list[np.ndarray], int]]) -> dict[str, Any]:
    """cosparse.tune on the same trace, capacity and warm-up as the engine's steady figures.

    Demand (lookahead 0): hits over the steady batches (``hit_rate_warm`` with the warm-up set to the
    engine's). Lookahead k: no-transfer fraction = 1 - (fetches for the steady batches) / lookups,
    fetches for the steady batches = fetches(whole trace) - fetches(trace cut after the warm-up).
    """
    from cosparse.tune import CacheSimulator, Trace

    class WarmSim(CacheSimulator):
        def __init__(self, trace: Any, warm: int, counts: np.ndarray | None = None) -> None:
            super().__init__(trace)
            self._warm = warm
            if counts is not None:
                self._counts = counts

        @property
        def warmup_batches(self) -> int:
            return self._warm

    k, cap, w = cfg.lookahead, cfg.device_rows, cfg.warmup
    runs = [(p, k) for p in (*POLICIES, "belady", "popularity_oracle")]
    runs += [(p, 0) for p in (*POLICIES, "belady", "popularity_oracle")]
    acc: dict[str, dict[str, float]] = {}
    t0 = time.perf_counter()
    for batches, num_ids in traces:
        tr = Trace.from_batches(batches, num_ids)
        full = WarmSim(tr, w)
        pre = WarmSim(Trace(tr.ids[: tr.offsets[w]], tr.offsets[: w + 1].copy(), num_ids), w,
                      full.total_counts())
        for pol, kk in runs:
            r = full.run(cap, pol, kk, cfg.decay)
            name = f"{pol}_k{kk}"
            a = acc.setdefault(name, dict.fromkeys(
                ("lookups_warm", "hits_warm", "fetches_warm", "shrinks", "feasible"), 0.0))
            if not r.feasible:
                a["feasible"] += 1
                continue
            fp = pre.run(cap, pol, kk, cfg.decay).fetches if w > 0 else 0
            a["lookups_warm"] += r.lookups_warm
            a["hits_warm"] += r.hits_warm
            a["fetches_warm"] += r.fetches - fp
            a["shrinks"] += r.shrinks
    out: dict[str, Any] = {}
    for name, a in acc.items():
        lw = max(a["lookups_warm"], 1)
        out[name] = {"hit_rate_warm": round(a["hits_warm"] / lw, 4),
                     "no_transfer_warm": round(1 - a["fetches_warm"] / lw, 4),
                     "fetch_rate_warm": round(a["fetches_warm"] / lw, 4),
                     "shrinks_sum_tables": int(a["shrinks"]),
                     "infeasible_tables": int(a["feasible"])}
    out["_sim_s"] = round(time.perf_counter() - t0, 1)
    return out
