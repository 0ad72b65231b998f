"""Tiered-store DLRM benchmark: all rows resident vs a 10% device tier (host 100% / host 25% + spill),
plus device hit rates per eviction policy against Belady and the popularity oracle.

Workload: benchmarks.common's (8 tables x 1M x 64 fp32, Zipf 1.05 IDs, bags 1..20, batch 4096,
DLRM 13-512-256-64 / 512-256-1, row-wise Adagrad on embeddings, Adagrad on dense; raw int64 IDs,
dynamic vocabulary). ``--quick`` / ``--tiny`` shrink it (see ``--help`` and benchmarks/README.md).

Contenders, each in its OWN worker process (benchmarks.common's protocol), ALTERNATING rounds:
  resident            EmbeddingCollection without tiers.
  dev10_host100       TierPlan(device_rows=10% of rows, host unbounded), lookahead 4, hotness.
  dev10_host25_spill  TierPlan(device 10%, host 25%, spill=True), lookahead 4, hotness.
Each worker trains like the trainer: one long-lived ``Prefetcher(source, ec.prepare_and_stage,
lookahead)``, forward, BCE, backward, dense Adagrad step, ``ec.apply_gradients()``. Its source is
*gated*: during a round it may prepare+plan up to the first batch of the next round, never more, so
between rounds (while other contenders are timed) it does no work, and every timed round does the
same work as steady-state training (n steps, n prepares+plans). The first ``warmup`` batches (20% of
the trained batches) are trained untimed before round 0 and are left out of every hit rate.

Counters are read on the prefetch thread right after each batch is planned (the engine counts a
device hit at plan time), so per-batch figures are exact whatever the prefetch depth.

Policy comparison (after the timed rounds, in the parent): the dev10_host100 configuration with
device policy lru / lfu / hotness, PLAN-ONLY (prepare + stage + planner.mark_done per batch, no
training: placement depends only on the IDs, which the hotness pass checks against the trained
dev10_host100 worker). The hotness pass also runs under cProfile (the planner's cost profile).

Simulator: per table, the unique IDs of every trained batch mapped to dense ints, run through
cosparse.tune (same capacity, same warm-up exclusion): Belady demand (lookahead 0) hit rate, the
popularity oracle and lru/lfu/hotness with lookahead 4 as no-transfer fractions (1 - fetches per
lookup over the steady batches). See benchmarks/README.md for the exact definitions.

Memory: after the rounds each tiered worker reports ``bytes_per_row_overhead``, the bytes its tables
keep beyond the rows and their optimizer state (``TieredTable.memory_overhead``: ID maps, slot maps,
flags, hotness, horizon, in-flight pins, at their arrays' capacity) per live row (target <= 24 B).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import json
import os
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import common

CONTENDERS = ("resident", "dev10_host100", "dev10_host25_spill")
TIERED = CONTENDERS[1:]
POLICIES = ("lru", "lfu", "hotness")
TARGETS = {  # name -> minimum; never loosen
    "tiered_over_resident": 0.8,
    "tiered_over_resident_paired": 0.9,  # issue 17: device 10%, host 100%; the paired one counts
    "spill_over_resident_paired": 0.85,  # issue 17: host 25% and spill
    "policy_over_belady": 0.9,
    "policy_over_popularity_oracle": 0.97,
    "policy_over_bound": 0.97,
}
TARGETS_MAX = {  # name -> maximum; never loosen
    "bytes_per_row_overhead": 24.0,  # the worst tiered contender
}
COUNTER_KEYS = ("lookups", "device_hits", "host_hits", "backing_hits", "fresh_rows",
                "evictions_device", "evictions_host", "writebacks_device", "bytes_host_device",
                "bytes_device_host", "bytes_backing_device", "bytes_host_backing")
LINKS = {"host_device": "bytes_host_device", "device_host": "bytes_device_host",
         "backing_device": "bytes_backing_device", "host_backing": "bytes_host_backing"}
# imported before the engine sources are hashed: others may edit them mid-run, and the plan-only
# passes must run the same code as the workers (the JSON records every process's hash)
ENGINE_MODULES = ("cosparse.nn.embedding", "cosparse.models.dlrm", "cosparse.train.prefetch")


# ------------------------------------------------------------------------------------- config
@dataclasses.dataclass
class TiersConfig(common.Workload):
    warmup: int = 15  # untimed trained batches before round 0; also the hit-rate warm-up
    steps: int = 10
    rounds: int = 6
    lookahead: int = 4
    horizon: int = 32  # batches read beyond the pinned window; eviction passes over their rows
    device_frac: float = 0.10
    host_frac: float = 0.25
    decay: float = 0.99
    threads: int = 0
    policy_passes: bool = True
    device: str = "cpu"  # where the device tier and the model live (the host tier: the CPU)

    @property
    def n_train(self) -> int:
        return self.warmup + self.rounds * self.steps

    @property
    def n_batches(self) -> int:  # one more: the last round prepares the batch after it
        return self.n_train + 1

    def round_start(self, r: int) -> int:
        return self.warmup + r * self.steps

    @property
    def device_rows(self) -> int:
        return max(1, int(round(self.rows * self.device_frac)))

    @property
    def host_rows(self) -> int:
        return max(1, int(round(self.rows * self.host_frac)))


# ----------------------------------------------------------------------------------- contenders
def build_ec(cfg: TiersConfig, contender: str, policy: str = "hotness") -> Any:
    import torch

    from cosparse.nn.embedding import EmbeddingCollection
    from cosparse.store.types import TierPlan
    from cosparse.supply.placements import tiered_tables

    tables = common.table_configs(cfg)
    if contender == "resident":
        return EmbeddingCollection(tables, device=cfg.device)
    if contender == "dev10_host100":
        plan = TierPlan(cfg.device_rows, None, False, device_policy=policy, decay=cfg.decay)
    elif contender == "dev10_host25_spill":
        plan = TierPlan(cfg.device_rows, cfg.host_rows, True, device_policy=policy, decay=cfg.decay)
    else:
        raise ValueError(f"unknown contender {contender!r}")
    dev = torch.device(cfg.device)
    placements = tiered_tables(tables, dev, {t.name: plan for t in tables})
    return EmbeddingCollection(tables, dev, placements, lookahead=cfg.lookahead)


def snapshot(ec: Any) -> dict[str, Any]:
    """Cumulative counters per tiered table (+ lookahead shrinks), read on the planning thread."""
    return {"tables": {n: c.as_dict() for n, c in ec.counters().items()},
            "shrinks": int(ec.planner.shrinks)}


# -------------------------------------------------------------------------------- the worker
class TierContender:
    """One contender: EC + DLRM, trained through one long-lived, gated Prefetcher."""

    def __init__(self, name: str, cfg: TiersConfig, raw: list[common.Batch]) -> None:
        import torch

        from cosparse.train.prefetch import Prefetcher

        common.set_numba_threads(cfg.threads)
        self.name, self.cfg = name, cfg
        torch.manual_seed(cfg.seed)
        self.ec = build_ec(cfg, name)
        self.model, self.opt = common.cosparse_dlrm(self.ec, cfg)
        self.gate = common.GatedSource(common.sparse_batches(cfg, raw))
        self.pf = Prefetcher(self.ec.staged(iter(self.gate), cfg.horizon), self._snap, cfg.lookahead)
        self.it = iter(self.pf)
        self.trained = 0
        self.last_loss = float("nan")

    def _snap(self, p: Any) -> Any:
        p.bench_snap = snapshot(self.ec)  # right after this batch was planned, on this thread
        return p

    def train(self, start: int, n: int) -> dict[str, Any]:
        if start != self.trained:
            raise RuntimeError(f"{self.name}: asked to train from batch {start}, next is {self.trained}")
        self.gate.allow(start + n + self.cfg.horizon)  # up to the horizon past the next round's first
        stage0 = dict(self.ec.stage_ms)
        wait0 = self.pf.wait_ms
        times, snaps, plan_ms, prep_ms = [], {}, [], []
        last = time.perf_counter()
        for k in range(n):
            p = next(self.it)
            if p.batch.index != start + k:
                raise RuntimeError(f"{self.name}: got batch {p.batch.index}, expected {start + k}")
            loss = common.train_step(self.model, self.opt, self.ec, p)
            common.sync(self.ec.device)
            now = time.perf_counter()
            times.append(now - last)
            last = now
            snaps[start + k] = p.bench_snap
            plan_ms.append(p.plan_ms)
            prep_ms.append(p.prep_ms)
        self.trained += n
        self.last_loss = float(loss.detach())
        stage = {k: v - stage0.get(k, 0.0) for k, v in self.ec.stage_ms.items()}
        return {"step_s": times, "loss": self.last_loss, "snaps": snaps, "plan_ms": plan_ms,
                "prep_ms": prep_ms, "wait_ms": self.pf.wait_ms - wait0, "stage_ms": stage}

    def stats(self) -> dict[str, Any]:
        import numba
        import torch

        return {"hbm_share": self.ec.hbm_share(), "lookahead_shrinks": int(self.ec.planner.shrinks),
                "torch_threads": torch.get_num_threads(), "numba_threads": numba.get_num_threads(),
                "rows_per_table": int(np.mean([t.num_rows for t in self.ec.tables.values()])),
                "memory_overhead": memory_overhead(self.ec)}

    def close(self) -> None:
        self.gate.stop()
        self.ec.planner.cancel()
        self.pf.close()
        self.ec.planner.reset(self.trained)


def memory_overhead(ec: Any) -> dict[str, Any] | None:
    """Bytes per live row beyond the row and its optimizer state, summed over the tiered tables
    (``memory_overhead`` of each: ID maps, slot maps, flags, hotness, horizon, pins in flight);
    None for a contender without tiers."""
    parts = [t.memory_overhead() for t in ec.tables.values() if hasattr(t, "memory_overhead")]
    if not parts:
        return None
    tot = {k: sum(p[k] for p in parts) for k in parts[0]}
    live = max(tot.pop("live_rows"), 1)
    total = tot.pop("total")
    return {"bytes_per_row": round(total / live, 2), "total_bytes": total, "live_rows": live,
            "per_row_by_kind": {k: round(v / live, 2) for k, v in tot.items()}}


def serve_tiers(name: str, cfg: TiersConfig, data: Path) -> None:
    """Worker: load the batches the parent saved, build the contender, answer train / stats."""

    def setup() -> tuple[TierContender, dict[str, Any]]:
        common.set_threads(cfg.threads)
        t0 = time.perf_counter()
        fingerprint = common.engine_fingerprint(ENGINE_MODULES)
        raw = common.load_batches(data)
        checksum = common.data_checksum(raw)
        rss_data = common.rss_mb()
        c = TierContender(name, cfg, raw)
        return c, {"checksum": checksum, "engine": fingerprint,
                   "setup_s": round(time.perf_counter() - t0, 2), "rss_after_data_mb": round(rss_data)}

    common.serve(setup, {"train": lambda c, cmd: c.train(cmd["start"], cmd["n"]),
                         "stats": lambda c, cmd: common.process_stats(c.stats())})


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


# ------------------------------------------------------------------------------------ parent
def run_bench(a: argparse.Namespace) -> dict[str, Any]:
    cfg = config_from_args(a)
    common.require_device(cfg.device)
    env = common.worker_env(cfg.threads)
    common.set_threads(cfg.threads)
    cfg_json = json.dumps(dataclasses.asdict(cfg))
    machine = common.machine_info()
    engine = common.engine_fingerprint(ENGINE_MODULES)
    print(f"config: {cfg_json}\n  device_rows/table {cfg.device_rows:,}, host_rows/table (spill) "
          f"{cfg.host_rows:,}, trained batches {cfg.n_train} (warm-up {cfg.warmup})\n"
          f"machine: {json.dumps(machine)}", flush=True)
    t_start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="bench_tiers_"))
    workers: dict[str, common.Worker] = {}
    try:
        t0 = time.perf_counter()
        raw = common.make_batches(cfg, cfg.n_batches)
        data = tmp / "batches.npz"
        common.save_batches(raw, data)
        datagen_s = time.perf_counter() - t0
        checksum = common.data_checksum(raw)
        ipb = common.ids_per_batch(raw)
        print(f"data: {len(raw)} batches, {ipb:,.0f} IDs/batch, {datagen_s:.1f} s", flush=True)
        for n in CONTENDERS:
            workers[n] = common.Worker(n, "benchmarks.bench_tiers",
                                       ["--worker", n, "--config-json", cfg_json, "--data", str(data)], env)
        # while the workers set up (untimed): the ID traces and the simulator
        traces = build_traces(cfg, raw)
        sim = simulate_all(cfg, traces)
        print(f"simulator done ({sim['_sim_s']} s)", flush=True)
        common.wait_ready(workers, lambda r: f"setup {r['setup_s']} s, engine {r['engine']}", checksum)
        machine["engine_sources_sha1"] = {"parent": engine, **{n: w.ready["engine"]
                                                               for n, w in workers.items()}}

        res: dict[str, dict[str, Any]] = {n: {"sps": [], "step_s": [], "other_cpu": [], "snaps": {},
                                              "plan_ms": [], "prep_ms": [], "wait_ms": [],
                                              "stage_ms": [], "loss": None} for n in CONTENDERS}

        def call(n: str, start: int, steps: int, timed: bool) -> None:
            r, busy = workers[n].call_busy(cmd="train", start=start, n=steps)
            d = res[n]
            d["snaps"].update({int(k): v for k, v in r["snaps"].items()})
            d["loss"] = r["loss"]
            if timed:
                d["sps"].append(steps * cfg.batch / sum(r["step_s"]))
                d["step_s"].extend(r["step_s"])
                d["other_cpu"].append(round(common.other_cores(busy, r), 2))
                d["plan_ms"].extend(r["plan_ms"])
                d["prep_ms"].extend(r["prep_ms"])
                d["wait_ms"].append(r["wait_ms"] / steps)
                d["stage_ms"].append({k: v / steps for k, v in r["stage_ms"].items()})

        for n in CONTENDERS:  # warm-up: JIT, allocator, cache fill; the hit-rate warm-up too
            call(n, 0, cfg.warmup, timed=False)
        for r in range(cfg.rounds):
            for n in common.rotation(CONTENDERS, r):
                call(n, cfg.round_start(r), cfg.steps, timed=True)
            line = "  ".join(f"{n} {res[n]['sps'][-1]:,.0f}" for n in CONTENDERS)
            print(f"round {r + 1}/{cfg.rounds} samples/s: {line}", flush=True)
        stats = {n: w.call(cmd="stats") for n, w in workers.items()}
    finally:
        common.close_all(workers)
        shutil.rmtree(tmp, ignore_errors=True)

    # ----- policy passes (plan-only), after the timed rounds, workers gone
    policy: dict[str, Any] = {}
    if cfg.policy_passes:
        sbs = common.sparse_batches(cfg, raw)
        for pol in POLICIES:
            t0 = time.perf_counter()
            policy[pol] = plan_only(cfg, sbs, pol, profile=(pol == "hotness"))
            print(f"plan-only pass {pol}: {time.perf_counter() - t0:.1f} s", flush=True)
        del sbs
    machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    return assemble(cfg, res, stats, policy, sim, machine, ipb, t_start)


def assemble(cfg: TiersConfig, res: dict[str, Any], stats: dict[str, Any], policy: dict[str, Any],
             sim: dict[str, Any], machine: dict[str, Any], ipb: float,
             t_start: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["samples_per_s"] = {n: common.spread(res[n]["sps"]) for n in CONTENDERS}
    med = {n: out["samples_per_s"][n]["median"] for n in CONTENDERS}

    def paired(x: str) -> float:
        pairs = zip(res[x]["sps"], res["resident"]["sps"], strict=True)
        return round(common.median(a / b for a, b in pairs), 3)

    out["tiered_over_resident"] = round(med["dev10_host100"] / med["resident"], 3)
    out["tiered_over_resident_paired"] = paired("dev10_host100")
    out["spill_over_resident"] = round(med["dev10_host25_spill"] / med["resident"], 3)
    out["spill_over_resident_paired"] = paired("dev10_host25_spill")

    eng = {n: engine_figures(res[n]["snaps"], cfg) for n in TIERED}
    pol = {p: engine_figures(v["snaps"], cfg) for p, v in policy.items()}
    dev = {p: round(f["hit_rate_device"], 4) for p, f in pol.items()}
    best = max(dev, key=lambda p: dev[p]) if dev else "hotness"
    best_rate = dev.get(best, eng["dev10_host100"]["hit_rate_device"])
    out["hit_rate"] = {
        "device": dev,
        "device_best_policy": best,
        "device_by_contender": {n: round(eng[n]["hit_rate_device"], 4) for n in TIERED},
        "host": {n: round(eng[n]["hit_rate_host"], 4) for n in TIERED},
        "backing": {n: round(eng[n]["hit_rate_backing"], 4) for n in TIERED},
        "host_hits_over_device_misses": {n: round(eng[n]["host_hits_over_device_misses"], 4)
                                         for n in TIERED},
        "fresh_rows_per_lookup": {n: round(eng[n]["fresh_rows_per_lookup"], 4) for n in TIERED},
        "definition": "unique IDs already on the device when the batch is planned (lookahead "
                      f"{cfg.lookahead}) / unique IDs, summed over tables and the steady batches "
                      f"[{cfg.warmup}, {cfg.n_train})",
    }
    if "hotness" in policy:  # placement must not depend on training
        out["hit_rate"]["plan_only_matches_trained"] = (
            steady_counters(policy["hotness"]["snaps"], cfg)
            == steady_counters(res["dev10_host100"]["snaps"], cfg))
    out["belady_hit_rate"] = sim["belady_k0"]["hit_rate_warm"]
    out["belady_prefetch_no_transfer"] = sim[f"belady_k{cfg.lookahead}"]["no_transfer_warm"]
    out["popularity_oracle_no_transfer"] = sim[f"popularity_oracle_k{cfg.lookahead}"]["no_transfer_warm"]
    out["policy_over_belady"] = round(best_rate / out["belady_hit_rate"], 4)
    # the fair bound: the best no-transfer fraction of any cache of that size under the engine's
    # own lookahead and pins (Belady at lookahead k, as the live health check computes it)
    out["policy_over_bound"] = round(best_rate / out["belady_prefetch_no_transfer"], 4)
    out["policy_over_popularity_oracle"] = round(best_rate / out["popularity_oracle_no_transfer"], 4)
    out["engine_vs_simulator"] = {
        p: {"engine": dev[p], "simulator": sim[f"{p}_k{cfg.lookahead}"]["no_transfer_warm"],
            "gap": round(dev[p] - sim[f"{p}_k{cfg.lookahead}"]["no_transfer_warm"], 4)}
        for p in dev
    }
    out["simulator"] = sim
    out["bytes_per_batch"] = {n: eng[n]["bytes_per_batch"] for n in TIERED}
    out["evictions_per_batch"] = {n: eng[n]["evictions_per_batch"] for n in TIERED}
    out["lookahead_shrinks"] = {n: eng[n]["lookahead_shrinks"] for n in TIERED}
    out["lookahead_shrinks"].update({f"plan_only_{p}": f["lookahead_shrinks"] for p, f in pol.items()})
    out["hbm_share"] = {n: stats[n]["info"]["hbm_share"] for n in TIERED}
    mem = {n: stats[n]["info"]["memory_overhead"] for n in TIERED}
    out["bytes_per_row_overhead"] = {n: m["bytes_per_row"] for n, m in mem.items()}
    out["memory_overhead"] = {
        **mem, "definition": "bytes per live row (distinct IDs in the local tiers, after the run) "
                             "beyond the row and its optimizer state: ID maps, slot maps, flags, "
                             "hotness, horizon and in-flight pins, at their arrays' capacity"}
    targets = {"tiered_over_resident": out["tiered_over_resident"],
               "tiered_over_resident_paired": out["tiered_over_resident_paired"],
               "spill_over_resident_paired": out["spill_over_resident_paired"],
               "policy_over_belady": out["policy_over_belady"],
               "policy_over_bound": out["policy_over_bound"],
               "policy_over_popularity_oracle": out["policy_over_popularity_oracle"]}
    out["targets"] = {k: {"value": v, "target": TARGETS[k], "pass": bool(v >= TARGETS[k])}
                      for k, v in targets.items()}
    worst = max(TIERED, key=lambda n: out["bytes_per_row_overhead"][n])
    out["targets"]["bytes_per_row_overhead"] = {
        "value": out["bytes_per_row_overhead"][worst], "contender": worst, "at_most": True,
        "target": TARGETS_MAX["bytes_per_row_overhead"],
        "pass": bool(out["bytes_per_row_overhead"][worst] <= TARGETS_MAX["bytes_per_row_overhead"])}
    out["plan_profile"] = policy.get("hotness", {}).get("profile", {})
    out["plan_only_plan_ms_p50"] = {p: round(common.median(v["plan_ms"]), 1) for p, v in policy.items()}
    per: dict[str, Any] = {}
    for n in CONTENDERS:
        d = res[n]
        per[n] = {
            "samples_per_s": out["samples_per_s"][n],
            **common.step_ms(d["step_s"]),
            "plan_ms_per_batch_p50_p90": [round(common.pct(d["plan_ms"], q), 1) for q in (0.5, 0.9)],
            "prep_ms_per_batch_p50": round(common.median(d["prep_ms"]), 1),
            "trainer_wait_ms_per_step": [round(x, 1) for x in d["wait_ms"]],
            "stage_ms_per_step": common.median_by_key(d["stage_ms"]),
            "other_cpu_cores": d["other_cpu"],
            "loss_last": None if d["loss"] is None else round(d["loss"], 4),
            "peak_rss_mb": stats[n]["peak_rss_mb"],
            "info": stats[n]["info"],
        }
        if n in eng:
            per[n]["store"] = eng[n]
    out["contenders"] = per
    out["policy_passes"] = {p: {k: v for k, v in f.items()} for p, f in pol.items()}
    out["config"] = {**dataclasses.asdict(cfg), "device_rows": cfg.device_rows,
                     "host_rows_spill": cfg.host_rows, "ids_per_batch": round(ipb),
                     "order": "alternating rounds (start rotated each round); one process per "
                              "contender; gated long-lived Prefetcher per contender"}
    out["machine"] = machine
    out["wall_s"] = round(time.perf_counter() - t_start, 1)
    print_report(out)
    return out


def print_report(out: dict[str, Any]) -> None:
    print(f"\n{'contender':<20}{'samples/s':>11}{'min-max':>17}{'step p50 ms':>13}{'plan ms p50':>13}"
          f"{'wait ms/step':>14}{'other cpu':>11}")
    for n, p in out["contenders"].items():
        s = p["samples_per_s"]
        wait = common.median(p["trainer_wait_ms_per_step"])
        rng = f"{s['min']:,}-{s['max']:,}"
        print(f"{n:<20}{s['median']:>11,}{rng:>17}{p['step_ms_p50']:>13}"
              f"{p['plan_ms_per_batch_p50_p90'][0]:>13}{wait:>14.1f}{max(p['other_cpu_cores']):>11}")
    print()
    for k in ("tiered_over_resident", "tiered_over_resident_paired", "spill_over_resident",
              "spill_over_resident_paired", "belady_hit_rate", "belady_prefetch_no_transfer",
              "popularity_oracle_no_transfer", "policy_over_belady", "policy_over_popularity_oracle",
              "policy_over_bound"):
        print(f"{k} = {out[k]}")
    h = out["hit_rate"]
    print(f"hit_rate.device (plan-only, per policy) = {h['device']} best {h['device_best_policy']}")
    print(f"hit_rate.device (trained contenders) = {h['device_by_contender']}; "
          f"hit_rate.host = {h['host']}; backing = {h['backing']}")
    if "plan_only_matches_trained" in h:
        print(f"plan-only hotness counters == trained dev10_host100 counters: "
              f"{h['plan_only_matches_trained']}")
    print(f"engine vs simulator (no-transfer fraction, lookahead): {out['engine_vs_simulator']}")
    print(f"bytes/batch: {out['bytes_per_batch']}")
    print(f"evictions/batch: {out['evictions_per_batch']}; lookahead_shrinks: "
          f"{out['lookahead_shrinks']}; hbm_share: {out['hbm_share']}")
    if out["plan_profile"]:
        print(f"planner profile (hotness plan-only, {out['plan_profile']['total_ms_per_batch']} ms/batch "
              "tottime), top:")
        for r in out["plan_profile"]["top_tottime"][:8]:
            print(f"    {r['tottime_ms_per_batch']:>8} ms  {r['calls_per_batch']:>6} calls  {r['func']}")
    for n, m in out["memory_overhead"].items():
        if n != "definition":
            print(f"bytes_per_row_overhead {n} = {m['bytes_per_row']} ({m['live_rows']:,} live rows; "
                  f"per row by kind {m['per_row_by_kind']})")
    for k, t in out["targets"].items():
        op = "<=" if t.get("at_most") else ">="
        print(f"TARGET {k} {op} {t['target']}: {t['value']} {'PASS' if t['pass'] else 'MISS'}")
    print(f"wall {out['wall_s']} s; loadavg start {out['machine']['loadavg']} end "
          f"{out['machine']['loadavg_end']}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.add_run_args(ap,
                        quick="8 tables x 100k rows, batch 512 (device 10k rows), warm-up 5, "
                              "5 rounds x 4 steps: < 60 s",
                        tiny="smoke-test size: 2 tables x 10k rows, batch 128, warm-up 2, 5 rounds x 2 steps",
                        rounds="alternating timed rounds (>= 5 recommended)",
                        warmup="untimed trained batches before round 0 (also left out of the hit rates)")
    ap.add_argument("--lookahead", type=int)
    ap.add_argument("--horizon", type=int, help="batches read beyond the pinned window (0: off)")
    ap.add_argument("--no-policy-passes", action="store_true",
                    help="skip the plan-only lru/lfu/hotness passes")
    ap.add_argument("--data", help=argparse.SUPPRESS)
    common.add_device_arg(ap)
    return ap.parse_args(argv)


def config_from_args(a: argparse.Namespace) -> TiersConfig:
    cfg = TiersConfig(seed=a.seed, threads=a.threads, policy_passes=not a.no_policy_passes,
                      device=a.device)
    cfg = common.sized(cfg, a,
                       quick={"rows": 100_000, "batch": 512, "warmup": 5, "steps": 4, "rounds": 5},
                       tiny={"tables": 2, "rows": 10_000, "batch": 128, "warmup": 2, "steps": 2, "rounds": 5},
                       overrides=("steps", "rounds", "warmup", "tables", "rows", "batch", "horizon",
                                  "lookahead"))
    if cfg.warmup < 1 or cfg.rounds < 1 or cfg.steps < 1:
        raise SystemExit("--warmup, --rounds and --steps must be >= 1")
    return cfg


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.worker:
        serve_tiers(a.worker, TiersConfig(**json.loads(a.config_json)), Path(a.data))
        return 0
    out = run_bench(a)
    if a.json:
        common.write_json(a.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
