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
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.tiers_offline import (
    build_traces,
    engine_figures,
    plan_only,
    simulate_all,
    steady_counters,
)
from benchmarks.tiers_worker import (
    CONTENDERS,
    ENGINE_MODULES,
    POLICIES,
    TARGETS,
    TARGETS_MAX,
    TIERED,
    TiersConfig,
    serve_tiers,
)

__all__ = ["TARGETS", "TARGETS_MAX", "TiersConfig", "main"]  # (the tests' and workers' names)


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
