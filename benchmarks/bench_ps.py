"""Architecture A (ps-direct) vs the all-resident engine: DLRM training with every embedding row on
2 local parameter-server shards, against the same model with all rows resident in the trainer.

Workload: benchmarks.common's (8 tables x 1M x 64 fp32, Zipf 1.05 raw int64 IDs, bags 1..20,
batch 4096, DLRM 13-512-256-64 / 512-256-1, row-wise Adagrad on embeddings, Adagrad on dense).
``--quick`` / ``--tiny`` shrink it (see ``--help`` and benchmarks/README.md).

Contenders, each in its OWN worker process (benchmarks.common's protocol), ALTERNATING rounds:
  ps_direct  EmbeddingCollection over ps_tables(tables, client, lookahead=k): every table on the PS.
             The worker starts ``EmbeddedShards(shards, tables)``: real ``cosparse ps serve``
             processes, children of the worker, on the SAME cores as everything else. Each batch
             pulls its unique rows when it is planned (on the prefetch thread, up to k batches
             ahead), rows that a batch in flight will update are pulled right before the batch
             trains, and ``ec.apply_gradients()`` pushes the row gradients; the shards run the
             optimizer.
  resident   EmbeddingCollection(tables): all rows in the trainer process (the baseline).
Both train like the trainer: one long-lived ``Prefetcher(ec.staged(source, 0), identity,
lookahead)``, forward, BCE, backward, dense Adagrad step, ``ec.apply_gradients()``. The source is
*gated* (``GatedSource``, as in bench_tiers): during a round the prefetch thread may read at most
``lookahead`` batches past the round, so it does no work while the other contender is timed and
every timed round does steady-state work. Both contenders see the same batches in the same order
from the same seeds, so by the exactness invariant their losses must be identical
(``losses_identical``).
``--check-versions`` also checks every row ps_direct trains against the PS's version (a debug
PEEK per table and step: a stale row stops the run, naming it). Every process takes the hash
of the engine sources at its start, once ready and at the end: ``engine_sources_changed``
says that cosparse/ was edited during the run, so its processes may have run different code.

Figures come from the client's own counters (``PSClient.counters``: every byte on the sockets,
headers included). The worker wraps the client's request call (in its own process only) to split
the waits and requests by operation and by thread (prefetch thread vs trainer thread).
Issue 17's figures: ``shard_rows_per_core_s`` (rows served per second of the shards' own CPU
time, utime + stime split between PULL and PUSH by the serving thread's CPU per op, STATS
``cpu_s_by_op``), ``bytes_per_row_overhead`` (``ShardTable.overhead_bytes`` summed / live rows) and,
in the full run or with ``--pinned``, ``a_over_resident_pinned`` (one shard on its own core, the
trainer on the other; see benchmarks/README.md for the formulas).
Every shard process is stopped at the end and on errors; the parent checks that no ``ps serve``
process with this run's data directory remains (``shard_processes_left``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.ps_figures import pinned_ratio, row_overhead, shard_rows_per_core, targets
from benchmarks.ps_worker import (
    CONTENDERS,
    MB,
    PSBenchConfig,
    pin_cores,
    serve_ps,
    shard_processes,
)


# ------------------------------------------------------------------------------------ parent
def stop_leftovers(data_root: Path, wait_s: float = 10.0) -> list[int]:
    """Shard processes of this run still alive after the workers closed: wait, then kill them."""
    deadline = time.monotonic() + wait_s
    left = shard_processes(data_root)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = shard_processes(data_root)
    for pid in left:  # started (indirectly) by this run: its data dir is ours
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def run_bench(a: argparse.Namespace) -> dict[str, Any]:
    cfg = config_from_args(a)
    if cfg.pinned and pin_cores() is None:
        print("--pinned needs 2 CPUs (one for the trainer, one for the shard): skipped", flush=True)
        cfg = dataclasses.replace(cfg, pinned=False)
    env = common.worker_env(cfg.threads)
    cfg_json = json.dumps(dataclasses.asdict(cfg))
    machine = common.machine_info()
    print(f"config: {cfg_json}\n  trained batches {cfg.n_train} (warm-up {cfg.warmup}), "
          f"{cfg.shards} PS shards\nmachine: {json.dumps(machine)}", flush=True)
    t_start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="bench_ps_"))
    ps_dir = tmp / "ps"
    workers: dict[str, common.Worker] = {}
    left: list[int] = []
    try:
        t0 = time.perf_counter()
        raw = common.make_batches(cfg, cfg.n_batches)
        data = tmp / "batches.npz"
        common.save_batches(raw, data)
        checksum = common.data_checksum(raw)
        ipb = common.ids_per_batch(raw)
        del raw
        print(f"data: {cfg.n_batches} batches, {ipb:,.0f} IDs/batch, "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        for n in cfg.contenders:
            workers[n] = common.Worker(n, "benchmarks.bench_ps",
                                       ["--worker", n, "--config-json", cfg_json, "--data", str(data),
                                        "--ps-dir", str(ps_dir)], env)
        common.wait_ready(workers, lambda r: f"setup {r['setup_s']} s, pid {r['pid']}"
                                             + (f", shard pids {r['shard_pids']}" if r["shard_pids"] else ""),
                          checksum)

        machine["engine_sources_sha1"] = {n: list(w.ready["engine"]) for n, w in workers.items()}
        if _sources_changed(machine):
            print(f"WARNING: the workers run different engine sources "
                  f"{machine['engine_sources_sha1']} (cosparse/ edited during start-up)", flush=True)
        res: dict[str, dict[str, Any]] = {n: defaultdict(list) for n in cfg.contenders}
        losses: dict[str, dict[int, float]] = {n: {} for n in cfg.contenders}

        def call(n: str, start: int, steps: int, timed: bool) -> None:
            r, busy = workers[n].call_busy(cmd="train", start=start, n=steps)
            losses[n].update({start + k: v for k, v in enumerate(r["losses"])})
            if not timed:
                return
            d = res[n]
            d["sps"].append(steps * cfg.batch / sum(r["step_s"]))
            d["step_s"].extend(r["step_s"])
            d["round_wall_s"].append(r["round_wall_s"])
            d["shard_cores"].append(r["shard_cpu_s"] / r["wall_s"])
            d["shard_cpu_s"].append(r["shard_cpu_s"])
            d["shard_ops"].append(r["shard_ops"])
            d["worker_cores"].append(r["cpu_s"] / r["wall_s"])
            d["other_cpu"].append(common.other_cores(busy, r, r["shard_cpu_s"]))
            d["wait_ms"].append(r["wait_ms"] / steps)
            d["stage_ms"].append({k: v / steps for k, v in r["stage_ms"].items()})
            d["step_parts_ms"].append(r["step_parts_ms"])
            d["unique_rows"].extend(r["unique_rows"])
            d["rows"].append(r["rows"])
            if "client" in r:
                d["client"].append(r["client"])

        for n in cfg.contenders:  # warm-up: JIT in workers and shards, allocator, vocabulary growth
            call(n, 0, cfg.warmup, timed=False)
        for r in range(cfg.rounds):
            for n in common.rotation(cfg.contenders, r):
                call(n, cfg.round_start(r), cfg.steps, timed=True)
            line = "  ".join(f"{n} {res[n]['sps'][-1]:,.0f}" for n in cfg.contenders)
            print(f"round {r + 1}/{cfg.rounds} samples/s: {line}  (shards used "
                  f"{res['ps_direct']['shard_cores'][-1]:.2f} cores)", flush=True)
        stats = {n: w.call(cmd="stats") for n, w in workers.items()}
        for n in cfg.contenders:  # start, ready (shards up), end
            machine["engine_sources_sha1"][n].append(stats[n]["engine"])
    finally:
        common.close_all(workers)
        left = stop_leftovers(ps_dir)
        shutil.rmtree(tmp, ignore_errors=True)
    machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    return assemble(cfg, res, losses, stats, machine, ipb, left, t_start)


def _sources_changed(machine: dict[str, Any]) -> bool:
    """Whether any process of the run saw other engine sources than the others, at any point."""
    return len({h for hs in machine["engine_sources_sha1"].values() for h in hs}) > 1


def assemble(cfg: PSBenchConfig, res: dict[str, Any], losses: dict[str, dict[int, float]],
             stats: dict[str, Any], machine: dict[str, Any], ipb: float,
             left: list[int], t_start: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["samples_per_s"] = {n: common.spread(res[n]["sps"]) for n in CONTENDERS}
    med = {n: out["samples_per_s"][n]["median"] for n in CONTENDERS}
    out["ratio"] = round(med["ps_direct"] / med["resident"], 3)
    out["ratio_paired"] = round(common.median(x / y for x, y in zip(res["ps_direct"]["sps"],
                                                                    res["resident"]["sps"], strict=True)), 3)
    d = res["ps_direct"]
    steps = cfg.rounds * cfg.steps
    tot = {k: sum(c[k] for c in d["client"]) for k in ("bytes_pull", "bytes_push", "bytes_other",
                                                       "requests", "wait_s")}
    by_wait: dict[str, float] = defaultdict(float)
    by_req: dict[str, int] = defaultdict(int)
    for c in d["client"]:  # (the STATS of the shards' per-op figures are outside the rounds)
        for k, v in c["wait_s_by"].items():
            if not k.startswith("STATS@"):
                by_wait[k] += v
        for k, v in c["requests_by"].items():
            if not k.startswith("STATS@"):
                by_req[k] += v
    pull_wait = sum(v for k, v in by_wait.items() if k.startswith("PULL@"))
    push_wait = sum(v for k, v in by_wait.items() if k.startswith("PUSH@"))
    wall = sum(d["round_wall_s"])
    pulled = sum(r["pulled"] for r in d["rows"])
    deferred = sum(r["deferred"] for r in d["rows"])
    unique = sum(d["unique_rows"])
    row_b = cfg.dim * 4
    out["bytes"] = {"trainer_ps": {
        "pull_per_step": round(tot["bytes_pull"] / steps),
        "push_per_step": round(tot["bytes_push"] / steps),
        "other_per_step": round(tot["bytes_other"] / steps),
        "total_per_step": round((tot["bytes_pull"] + tot["bytes_push"] + tot["bytes_other"]) / steps),
        "pull_row_payload_per_step": round(pulled * row_b / steps),
        "push_grad_payload_per_step": round(unique * row_b / steps),
        "pull_bytes_per_pulled_row": round(tot["bytes_pull"] / max(pulled, 1), 1),
        "push_bytes_per_pushed_row": round(tot["bytes_push"] / max(unique, 1), 1),
        "source": "PSClient.counters (every socket byte, headers included), summed over the "
                  "timed rounds / timed steps",
    }}
    out["ps_pull_mb_per_s"] = {
        "over_pull_wait": round(tot["bytes_pull"] / MB / max(pull_wait, 1e-9), 1),
        "over_wall": round(tot["bytes_pull"] / MB / max(wall, 1e-9), 1),
        "push_over_push_wait": round(tot["bytes_push"] / MB / max(push_wait, 1e-9), 1),
        "definition": "pull bytes (10^6 B) / seconds the client waited for PULL replies (after "
                      "sending, both threads), and / wall time of the timed rounds",
    }
    out["requests_per_step"] = {
        "total": round(tot["requests"] / steps, 2),
        **{k: round(v / steps, 2) for k, v in sorted(by_req.items())},
    }
    out["ps_wait_ms_per_step"] = {
        "total": round(1e3 * tot["wait_s"] / steps, 2),
        "pull": round(1e3 * pull_wait / steps, 2),
        "push": round(1e3 * push_wait / steps, 2),
        **{k: round(1e3 * v / steps, 2) for k, v in sorted(by_wait.items())},
        "note": "PULL@prefetch overlaps training (rows of the next batch); PULL@trainer (rows a "
                "batch in flight updated, pulled right before the batch trains) and PUSH@trainer "
                "are on the step's critical path",
    }
    out["rows_per_step"] = {"unique": round(unique / steps), "pulled": round(pulled / steps),
                            "deferred_then_pulled": round(deferred / steps),
                            "deferred_fraction": round(deferred / max(unique, 1), 4)}
    out["shard_cpu_cores"] = {"median": round(common.median(d["shard_cores"]), 2),
                              "rounds": [round(x, 2) for x in d["shard_cores"]]}
    both = sorted(set(losses["ps_direct"]) & set(losses["resident"]))
    diffs = [abs(losses["ps_direct"][i] - losses["resident"][i]) for i in both]
    out["losses_identical"] = bool(both) and max(diffs) == 0.0
    out["engine_sources_changed"] = _sources_changed(machine)
    out["loss_max_abs_diff"] = max(diffs) if diffs else None
    left_now = [p for p in left if Path(f"/proc/{p}").exists()]
    out["shard_processes_left"] = len(left_now)
    out["shard_processes_killed_by_parent"] = len(left)
    out["shard_rows_per_core_s"] = shard_rows_per_core(d)
    out["bytes_per_row_overhead"] = row_overhead(stats["ps_direct"]["info"].get("shard_stats"))
    out["a_over_resident_pinned"] = pinned_ratio(cfg, res, losses)
    out["targets"] = targets(out)
    per: dict[str, Any] = {}
    for n in cfg.contenders:
        r = res[n]
        part_keys = list(r["step_parts_ms"][0]) if r["step_parts_ms"] else []  # in step order
        per[n] = {
            "samples_per_s": common.spread(r["sps"]),
            **common.step_ms(r["step_s"]),
            "trainer_wait_ms_per_step": [round(x, 1) for x in r["wait_ms"]],
            "stage_ms_per_step": common.median_by_key(r["stage_ms"]),
            "step_parts_ms": {k: round(common.median(s[k] for s in r["step_parts_ms"]), 1)
                              for k in part_keys},
            "worker_cpu_cores": [round(x, 2) for x in r["worker_cores"]],
            "other_cpu_cores": [round(x, 2) for x in r["other_cpu"]],
            "loss_last": losses[n][max(losses[n])] if losses[n] else None,
            "peak_rss_mb": stats[n]["peak_rss_mb"],
            "info": stats[n]["info"],
        }
    for n in ("ps_direct", "ps_pinned"):
        if n in per:
            per[n]["shard_cpu_cores"] = [round(x, 2) for x in res[n]["shard_cores"]]
    out["contenders"] = per
    out["config"] = {**dataclasses.asdict(cfg), "ids_per_batch": round(ipb),
                     "order": "alternating rounds (start rotated each round); one worker process "
                              "per contender; the ps_direct worker's shards are its child processes; "
                              "gated long-lived Prefetcher per contender"}
    out["machine"] = machine
    out["wall_s"] = round(time.perf_counter() - t_start, 1)
    print_report(out)
    return out


def print_report(out: dict[str, Any]) -> None:
    print(f"\n{'contender':<12}{'samples/s':>11}{'min-max':>17}{'step p50 ms':>13}"
          f"{'worker cores':>14}{'shard cores':>13}{'other cpu':>11}")
    for n, p in out["contenders"].items():
        s = p["samples_per_s"]
        sh = common.median(p["shard_cpu_cores"]) if "shard_cpu_cores" in p else 0.0
        rng = f"{s['min']:,}-{s['max']:,}"
        print(f"{n:<12}{s['median']:>11,}{rng:>17}{p['step_ms_p50']:>13}"
              f"{common.median(p['worker_cpu_cores']):>14.2f}{sh:>13.2f}{max(p['other_cpu_cores']):>11}")
    for n, p in out["contenders"].items():
        print(f"  {n} step parts (ms/step, median over rounds): {p['step_parts_ms']}")
    print()
    print(f"ratio (ps_direct / resident) = {out['ratio']}  (paired {out['ratio_paired']})")
    b = out["bytes"]["trainer_ps"]
    print(f"bytes.trainer_ps per step: pull {b['pull_per_step']:,}  push {b['push_per_step']:,}  "
          f"other {b['other_per_step']:,}  ({b['pull_bytes_per_pulled_row']} B per pulled row, "
          f"{b['push_bytes_per_pushed_row']} B per pushed row)")
    m = out["ps_pull_mb_per_s"]
    print(f"PS pull MB/s: {m['over_pull_wait']} over pull wait, {m['over_wall']} over wall; "
          f"push {m['push_over_push_wait']} over push wait")
    print(f"requests/step: {out['requests_per_step']}")
    print(f"PS wait ms/step: { {k: v for k, v in out['ps_wait_ms_per_step'].items() if k != 'note'} }")
    print(f"rows/step: {out['rows_per_step']}")
    rp = out["shard_rows_per_core_s"]
    print(f"shard rows per core-second: pull {rp['pull']}, push {rp['push']} (serving thread "
          f"only: pull {rp['pull_serving_thread_only']}, push {rp['push_serving_thread_only']}; "
          f"shard CPU {rp['shard_cpu_s']} s)")
    o = out["bytes_per_row_overhead"]
    print(f"shard bytes per row: overhead {o['value']} (+ slab slack {o.get('slab_slack_bytes_per_row')}), "
          f"row and state {o.get('row_and_state_bytes_per_row')}")
    pin = out["a_over_resident_pinned"]
    if "ratio" in pin:
        print(f"A / resident, 1 shard pinned to its own core: {pin['ratio']} (paired "
              f"{pin['ratio_paired']}; losses identical {pin['losses_identical']})")
    else:
        print(f"A / resident pinned: {pin['skipped']}")
    for k, t in out["targets"].items():
        print(f"TARGET {k}: {t['value']} {'PASS' if t['pass'] else 'MISS'}")
    print(f"losses identical (A == all-resident): {out['losses_identical']}; "
          f"shard processes left: {out['shard_processes_left']}")
    if out["engine_sources_changed"]:
        print("WARNING: cosparse/ was edited during the run: its processes ran different engine "
              f"sources {out['machine']['engine_sources_sha1']}; rerun to compare them", flush=True)
    print(f"wall {out['wall_s']} s; loadavg start {out['machine']['loadavg']} end "
          f"{out['machine']['loadavg_end']}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.add_run_args(ap,
                        quick="8 tables x 100k rows, batch 1024, warm-up 3, 3 rounds x 4 steps: < 60 s",
                        tiny="smoke-test size: 2 tables x 10k rows, batch 128, warm-up 2, 3 rounds x 2 steps")
    ap.add_argument("--check-versions", action="store_true",
                    help="debug: check every row ps_direct trains against the PS's version (one "
                         "extra PEEK per table and step; a stale row stops the run, naming it)")
    ap.add_argument("--shards", type=int, help="PS shard processes (default 2)")
    ap.add_argument("--lookahead", type=int, help="batches planned (pulled) ahead (default 1)")
    ap.add_argument("--pinned", action=argparse.BooleanOptionalAction, default=None,
                    help="also run A with 1 shard pinned to one core and its trainer to another, "
                         "against all-resident on the trainer's core (a_over_resident_pinned; "
                         "default: on in the full run, off with --quick / --tiny)")
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--ps-dir", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def config_from_args(a: argparse.Namespace) -> PSBenchConfig:
    pinned = a.pinned if a.pinned is not None else not (a.quick or a.tiny)
    cfg = PSBenchConfig(seed=a.seed, threads=a.threads, check_versions=a.check_versions,
                        pinned=pinned)
    cfg = common.sized(cfg, a,
                       quick={"rows": 100_000, "batch": 1024, "warmup": 3, "steps": 4, "rounds": 3},
                       tiny={"tables": 2, "rows": 10_000, "batch": 128, "warmup": 2, "steps": 2, "rounds": 3},
                       overrides=("steps", "rounds", "warmup", "tables", "rows", "batch", "shards",
                                  "lookahead"))
    if cfg.warmup < 1 or cfg.rounds < 1 or cfg.steps < 1 or cfg.shards < 1 or cfg.lookahead < 1:
        raise SystemExit("--warmup, --rounds, --steps, --shards and --lookahead must be >= 1")
    return cfg


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.worker:
        serve_ps(a.worker, PSBenchConfig(**json.loads(a.config_json)), Path(a.data), Path(a.ps_dir))
        return 0
    out = run_bench(a)
    if a.json:
        common.write_json(a.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
