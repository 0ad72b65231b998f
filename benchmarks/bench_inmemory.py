"""In-memory DLRM training benchmark: cosparse vs plain torch (and, with ``--peer torchrec``, TorchRec).

Workload (TorchRec's own DLRM CPU workload; ``--quick`` / ``--tiny`` shrink it, see ``--help``):
  * 8 sparse features, one table each, 1M x 64 fp32, sum pooling
  * IDs ~ finite Zipf(1.05) over [0, rows) by inverse CDF, then a fixed per-table random permutation
    so the hot rows are scattered; bag sizes uniform 1..20; 13 dense N(0, 1) features; Bernoulli labels
  * batch 4096; dense MLP 13-512-256-64 (ReLU after each layer), DLRM dot interaction,
    top MLP 100-512-256-1 (no activation at the end), BCE with logits
  * row-wise Adagrad (lr 0.01, eps 1e-8) on the embeddings, torch.optim.Adagrad (lr 0.01) on dense
All batches are generated before timing from a fixed seed; every contender gets the same batches in
the same order, already converted to its native input format (SparseBatch / offsets / KJT).

Contenders, each in its OWN worker process (so peak RSS is per contender and thread pools do not mix):
  cosparse         EmbeddingCollection + cosparse DLRM, ``ec.prepare`` of batch t+1 on a background
                   thread (cosparse.train.prefetch.Prefetcher, lookahead 1): the trainer's way. HEADLINE.
  cosparse_inline  the same, with ``ec.prepare`` run inline inside the timed step.
  cosparse_fixed   cosparse with ``tables[i].vocab: fixed`` (``hash_size`` = rows): the IDs are row
                   numbers, no ID map, every row created at start-up (issue 35's fair comparison with
                   TorchRec, whose tables are fixed). ``ratio_vs_torchrec`` and
                   ``ratio_paired_cosparse_vs_torchrec`` stay the dynamic vocabulary's (ours as used);
                   ``ratio_paired_cosparse_fixed_vs_torchrec`` is this one's.
  torch            nn.EmbeddingBag(rows, 64, mode="sum", sparse=True) x 8, hand-written sparse row-wise
                   Adagrad (coalesce + per-row update, FBGEMM EXACT_ROWWISE_ADAGRAD math).
  dense_bound      the dense-only bound: the same DLRM and dense Adagrad fed precomputed pooled
                   embeddings (read before the clock starts), so the embedding cost is zero.
                   ``over_dense_bound`` = cosparse samples/s over the bound's (target >= 0.75, stretch
                   0.9, on the paired per-round median ``over_dense_bound_paired``).
  builtin, api     (``--contenders builtin,api``, benchmarks/trainer_contenders.py) the engine's trainer
                   over ``model.kind: dlrm`` against ``cosparse.Trainer`` over ``cosparse.models.dlrm:build``
                   (issue 34): ``api_over_builtin``, paired per round, and the same losses asserted.
  torchrec         (``--peer torchrec``) TorchRec DMP + FBGEMM CPU TBE with fused row-wise Adagrad, run
                   by benchmarks/peer_torchrec.py in the separate venv .venv-peers (``make peers``).
The parent process only orchestrates: it sends "run N steps" commands to the workers over stdin/stdout,
alternating between contenders in every round (the start of the order rotates each round), so machine
noise hits all of them.

Measurements:
  samples_per_s   per round = steps * batch / round wall time; reported as the median over rounds.
  step_ms         p50 over every timed step of every round.
  embedding_ms    a separate embedding-only pass per contender (also alternating, on fresh batches):
                  per step, the embedding forward, ``backward`` of the pooled outputs with a fixed random
                  upstream gradient, and the sparse optimizer (fused into backward for TorchRec). For
                  cosparse it includes ``ec.prepare`` (dedup, transposed index) run inline; the headline
                  cosparse figure comes from cosparse_inline, the prefetching worker's figure (prepare on
                  the background thread) is reported as ``cosparse_pipelined``. Median over rounds of the
                  per-round mean.
  peak_rss_mb     ru_maxrss of each worker process (includes its copy of the pre-generated batches,
                  reported separately as rss_after_data_mb).
  other_cpu       cores used by other processes during a round (from /proc/stat minus the worker's own
                  CPU time): a noise flag.
A last cosparse_inline pass wraps cosparse internals with timers (dedup, transpose, slots_for, gather,
pooled forward, backward, optimizer) to break the embedding time down by stage.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.inmemory_cosparse import CosparseContender, DenseBoundContender
from benchmarks.inmemory_torch import TorchContender
from benchmarks.inmemory_worker import BenchConfig, Contender, serve_contender
from benchmarks.trainer_contenders import TRAINERS, TrainerContender, paired_api, stage_differences

PEER_VENV = common.REPO / ".venv-peers"
DEFAULT = ("cosparse", "cosparse_inline", "cosparse_fixed", "torch", "dense_bound")
IN_PROCESS = (*DEFAULT, *TRAINERS)  # (the trainers: benchmarks/trainer_contenders.py)
NO_EMBEDDING = ("dense_bound", *TRAINERS)  # no embedding-only pass
# name -> minimum; never loosen (issue 35's goals; the TorchRec ones on an AVX-512 machine)
TARGETS = {"over_dense_bound_paired": 0.75, "ratio_paired_cosparse_vs_torchrec": 1.2,
           "ratio_paired_cosparse_fixed_vs_torchrec": 1.3, "embedding_ratio_vs_torchrec": 1.5}
STRETCH = {"over_dense_bound_paired": 0.9}
CLEAN_OTHER_CPU = 0.25  # a round is "clean" when other processes used less than this many cores
__all__ = ["BenchConfig", "Contender", "main", "serve_contender"]  # (the peer's imports)


def build_inprocess(name: str) -> Callable[[BenchConfig, list[common.Batch]], Contender]:
    if name == "cosparse":
        return lambda cfg, raw: CosparseContender(cfg, raw, lookahead=1)
    if name == "cosparse_fixed":
        return lambda cfg, raw: CosparseContender(cfg, raw, lookahead=1, vocab="fixed")
    if name == "cosparse_inline":
        return lambda cfg, raw: CosparseContender(cfg, raw, lookahead=0)
    if name == "torch":
        return TorchContender
    if name == "dense_bound":
        return DenseBoundContender
    if name in TRAINERS:
        return lambda cfg, raw: TrainerContender(cfg, raw, api=name == "api")
    raise ValueError(f"unknown contender {name!r}")


# ------------------------------------------------------------------------------------ parent
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.add_run_args(ap,
                        quick="8 tables x 100k rows (instead of 1M), warmup 2, 3 rounds x 5 steps, "
                              "3 embedding steps, 2 breakdown steps: < 60 s",
                        tiny="smoke-test size: 2 tables x 10k rows, batch 256, 2 rounds x 3 steps",
                        rounds="alternating rounds",
                        warmup="untimed train steps per contender before round 0")
    ap.add_argument("--emb-steps", type=int, help="embedding-only steps per contender per round")
    ap.add_argument("--breakdown-steps", type=int, help="cosparse stage-breakdown steps (0: skip)")
    ap.add_argument("--contenders", default=",".join(DEFAULT),
                    help=f"comma list out of {', '.join(IN_PROCESS)}; builtin,api: the trainer "
                         "with model.kind dlrm against the public API's DLRM (api_over_builtin)")
    ap.add_argument("--peer", choices=["torchrec"], action="append", default=[],
                    help="also run TorchRec DMP + FBGEMM (needs .venv-peers: `make peers`)")
    ap.add_argument("--peer-python", default=str(PEER_VENV / "bin" / "python"))
    common.add_device_arg(ap)
    return ap.parse_args(argv)


def config_from_args(a: argparse.Namespace) -> BenchConfig:
    return common.sized(BenchConfig(seed=a.seed, threads=a.threads, device=a.device), a,
                        quick={"rows": 100_000, "warmup": 2, "steps": 5, "rounds": 3, "emb_steps": 3,
                               "breakdown_steps": 2},
                        tiny={"tables": 2, "rows": 10_000, "batch": 256, "warmup": 1, "steps": 3, "rounds": 2,
                              "emb_steps": 2, "breakdown_steps": 1},
                        overrides=("steps", "rounds", "emb_steps", "warmup", "breakdown_steps", "tables",
                                   "rows", "batch"))


def run_bench(a: argparse.Namespace) -> dict[str, Any]:
    """Start the workers, alternate rounds, gather and print the results."""
    cfg = config_from_args(a)
    names = [n.strip() for n in a.contenders.split(",") if n.strip()]
    for n in names:
        if n not in IN_PROCESS:
            raise SystemExit(f"--contenders: unknown contender {n!r} (choose from {', '.join(IN_PROCESS)})")
    if cfg.device != "cpu" and ("torch" in names or a.peer):
        raise SystemExit(f"--device {cfg.device}: the torch and torchrec contenders run on the CPU "
                         "only; pass --contenders cosparse,cosparse_inline,dense_bound and no --peer")
    common.require_device(cfg.device)
    peer_py = Path(a.peer_python)
    if "torchrec" in a.peer:
        if not peer_py.exists():
            print(f"error: --peer torchrec needs the peer venv ({peer_py} not found).\n"
                  f"Create it with `make peers` (torch 2.13 + fbgemm-gpu-cpu 1.8 + torchrec 1.8, "
                  f"~1 GB), or point --peer-python at an interpreter that has torchrec.",
                  file=sys.stderr)
            raise SystemExit(2)
        names.append("torchrec")
    env = common.worker_env(cfg.threads)
    cfg_json = json.dumps(dataclasses.asdict(cfg))
    machine = common.machine_info()
    print(f"config: {cfg_json}\nmachine: {json.dumps(machine)}", flush=True)
    t_start = time.perf_counter()
    workers: dict[str, common.Worker] = {}
    try:
        # All workers set up (imports, data generation, model build) concurrently: it is not timed.
        for n in names:
            if n == "torchrec":
                workers[n] = common.Worker(n, "benchmarks.peer_torchrec", ["--config-json", cfg_json], env,
                                           python=str(peer_py))
            else:
                workers[n] = common.Worker(n, "benchmarks.bench_inmemory",
                                           ["--worker", n, "--config-json", cfg_json], env)
        common.wait_ready(workers, lambda r: f"data {r['datagen_s']} s, setup {r['setup_s']} s, "
                                             f"checksum {r['checksum']}")

        res: dict[str, dict[str, Any]] = {
            n: {"rounds_samples_per_s": [], "step_s": [], "emb_round_ms": [], "emb_step_ms": [],
                "emb_stages": defaultdict(list), "other_cpu": [], "loss": None, "losses": [],
                "run_s": []} for n in names
        }
        # warm-up (JIT, allocator, first-touch of rows), alternating too
        for n in names:
            workers[n].call(cmd="full", start=0, n=cfg.warmup)
            if n not in NO_EMBEDDING:
                workers[n].call(cmd="emb", start=max(cfg.warmup - 1, 0), n=1)
        for r in range(cfg.rounds):
            order = common.rotation(names, r)
            for n in order:
                out, busy = workers[n].call_busy(cmd="full", start=cfg.full_start(r), n=cfg.steps)
                d = res[n]
                d["rounds_samples_per_s"].append(cfg.steps * cfg.batch / sum(out["step_s"]))
                d["step_s"].extend(out["step_s"])
                d["other_cpu"].append(round(common.other_cores(busy, out), 2))
                d["loss"] = out["loss"]
                d["losses"].append(out["loss"])
                d["run_s"].append(out["run_s"])
            for n in order:
                if cfg.emb_steps <= 0 or n in NO_EMBEDDING:
                    continue
                if n == "cosparse_inline" and "cosparse" in workers:
                    continue  # the embedding-only pass of cosparse is the same code either way
                out = workers[n].call(cmd="emb", start=cfg.emb_start(r), n=cfg.emb_steps)
                d = res[n]
                d["emb_round_ms"].append(1e3 * statistics.fmean(out["step_s"]))
                d["emb_step_ms"].extend(1e3 * s for s in out["step_s"])
                for k, v in out["stages_ms"].items():
                    d["emb_stages"][k].append(v)
            line = "  ".join(f"{n} {res[n]['rounds_samples_per_s'][-1]:,.0f}" for n in names)
            print(f"round {r + 1}/{cfg.rounds} samples/s: {line}", flush=True)
        breakdown = {}
        if cfg.breakdown_steps > 0:
            bw = workers.get("cosparse") or workers.get("cosparse_inline")
            if bw is not None:
                breakdown = bw.call(cmd="breakdown", start=cfg.breakdown_start,
                                    n=cfg.breakdown_steps)["breakdown_ms"]
        stats = {n: w.call(cmd="stats") for n, w in workers.items()}
    finally:
        common.close_all(workers)
    machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    machine["torch_threads"] = {n: s["info"].get("torch_threads") for n, s in stats.items()}
    if "torchrec" in stats:  # (FBGEMM's side: benchmarks.machine.peer_isa, in the peer's venv)
        machine["peer_isa"] = stats["torchrec"]["info"].get("isa")

    per: dict[str, dict[str, Any]] = {}
    for n in names:
        d = res[n]
        clean = [x for x, o in zip(d["rounds_samples_per_s"], d["other_cpu"], strict=True)
                 if o < CLEAN_OTHER_CPU]
        per[n] = {
            "samples_per_s": round(common.median(d["rounds_samples_per_s"])),
            "samples_per_s_clean_rounds": round(common.median(clean)) if clean else None,
            "clean_rounds": len(clean),
            "rounds_samples_per_s": [round(x) for x in d["rounds_samples_per_s"]],
            **common.step_ms(d["step_s"]),
            "embedding_ms": round(common.median(d["emb_round_ms"]), 1) if d["emb_round_ms"] else None,
            "embedding_ms_rounds": [round(x, 1) for x in d["emb_round_ms"]],
            "embedding_step_ms_p50": round(common.median(d["emb_step_ms"]), 1) if d["emb_step_ms"] else None,
            "embedding_stages_ms": {k: round(common.median(v), 2) for k, v in d["emb_stages"].items()},
            "peak_rss_mb": stats[n]["peak_rss_mb"],
            "rss_after_data_mb": workers[n].ready["rss_after_data_mb"],
            "other_cpu_cores": d["other_cpu"],
            "loss_last": None if d["loss"] is None else round(d["loss"], 4),
            "info": stats[n]["info"],
        }
    out: dict[str, Any] = {}
    emb_ms: dict[str, float] = {}
    cos_emb = per.get("cosparse", per.get("cosparse_inline"))
    if cos_emb is not None and cos_emb["embedding_ms"] is not None:
        emb_ms["cosparse"] = cos_emb["embedding_ms"]
    for n in ("cosparse_fixed", "torch", "torchrec"):
        if n in per and per[n]["embedding_ms"] is not None:
            emb_ms[n] = per[n]["embedding_ms"]
    for n in names:
        out[f"{n}_samples_per_s"] = per[n]["samples_per_s"]
    if "cosparse" in per and "torch" in per:
        out["ratio"] = round(per["cosparse"]["samples_per_s"] / per["torch"]["samples_per_s"], 3)
    if "cosparse_inline" in per and "torch" in per:
        out["ratio_inline"] = round(
            per["cosparse_inline"]["samples_per_s"] / per["torch"]["samples_per_s"], 3)
    for a_, b_ in (("cosparse", "torch"), ("cosparse", "torchrec"), ("cosparse_inline", "torch"),
                   ("cosparse_fixed", "torchrec"), ("cosparse_fixed", "cosparse")):
        if a_ in res and b_ in res:  # same-round pairs: robust to slow drifts of machine load
            out[f"ratio_paired_{a_}_vs_{b_}"] = paired_ratio(res, a_, b_)
    if "cosparse" in per and "dense_bound" in per:  # end to end over the embedding-free bound
        out["over_dense_bound"] = round(
            per["cosparse"]["samples_per_s"] / per["dense_bound"]["samples_per_s"], 3)
        out["over_dense_bound_paired"] = paired_ratio(res, "cosparse", "dense_bound")
    if "cosparse" in emb_ms and "torch" in emb_ms:
        out["embedding_ratio"] = round(emb_ms["torch"] / emb_ms["cosparse"], 3)
    if "api" in res and "builtin" in res:  # the public API's cost: same numbers, same rounds
        out.update(paired_api(res))
        out["api_minus_builtin_stages_ms"] = stage_differences(stats["api"]["info"],
                                                               stats["builtin"]["info"])
    out["embedding_ms"] = emb_ms
    out["peak_rss_mb"] = {n: per[n]["peak_rss_mb"] for n in names}
    if "torchrec" in per:
        out["torchrec_samples_per_s"] = per["torchrec"]["samples_per_s"]
        out["torchrec_embedding_ms"] = per["torchrec"]["embedding_ms"]
        if "cosparse" in per:
            out["ratio_vs_torchrec"] = round(
                per["cosparse"]["samples_per_s"] / per["torchrec"]["samples_per_s"], 3)
        for n in ("cosparse", "cosparse_fixed"):
            if n in emb_ms and "torchrec" in emb_ms:
                out[f"embedding_ratio{n[8:]}_vs_torchrec"] = round(
                    emb_ms["torchrec"] / emb_ms[n], 3)
    out["targets"] = {k: {"value": out[k], "target": t, "stretch": STRETCH.get(k),
                          "pass": bool(out[k] >= t),
                          "stretch_pass": bool(out[k] >= STRETCH.get(k, float("inf")))}
                      for k, t in TARGETS.items() if k in out}
    out["cosparse_breakdown_ms"] = breakdown
    out["contenders"] = per
    first = next(iter(workers.values())).ready
    out["config"] = {**dataclasses.asdict(cfg), "ids_per_batch": first["ids_per_batch"],
                     "order": "alternating rounds, start rotated each round; one process per contender"}
    out["machine"] = machine
    out["wall_s"] = round(time.perf_counter() - t_start, 1)
    print_table(out, per)
    return out


def paired_ratio(res: dict[str, dict[str, Any]], a: str, b: str) -> float:
    """Median over rounds of a's samples/s over b's in the same round."""
    pairs = zip(res[a]["rounds_samples_per_s"], res[b]["rounds_samples_per_s"], strict=True)
    return round(common.median(x / y for x, y in pairs), 3)


def print_table(out: dict[str, Any], per: dict[str, dict[str, Any]]) -> None:
    hdr = (f"{'contender':<16}{'samples/s':>11}{'rounds min-max':>17}{'step p50 ms':>13}"
           f"{'emb ms':>9}{'peak RSS MB':>13}{'other cpu':>11}{'loss':>8}")
    print("\n" + hdr + "\n" + "-" * len(hdr))
    for n, p in per.items():
        rs = p["rounds_samples_per_s"]
        emb = "-" if p["embedding_ms"] is None else p["embedding_ms"]
        loss = "-" if p["loss_last"] is None else p["loss_last"]
        print(f"{n:<16}{p['samples_per_s']:>11,}{f'{min(rs):,}-{max(rs):,}':>17}{p['step_ms_p50']:>13}"
              f"{emb:>9}{p['peak_rss_mb']:>13,}{max(p['other_cpu_cores']):>11}{loss:>8}")
    print()
    for k in ("ratio", "ratio_inline", "ratio_paired_cosparse_vs_torch", "embedding_ratio",
              "torchrec_samples_per_s", "torchrec_embedding_ms", "ratio_vs_torchrec",
              "ratio_paired_cosparse_vs_torchrec", "embedding_ratio_vs_torchrec",
              "ratio_paired_cosparse_fixed_vs_torchrec", "embedding_ratio_fixed_vs_torchrec",
              "ratio_paired_cosparse_fixed_vs_cosparse",
              "over_dense_bound", "over_dense_bound_paired", "api_over_builtin",
              "api_over_builtin_spread", "api_over_builtin_step_p50", "api_over_builtin_run",
              "api_builtin_final_loss", "api_minus_builtin_stages_ms"):
        if k in out:
            print(f"{k} = {out[k]}")
    for k, t in out.get("targets", {}).items():
        stretch = f" (stretch {t['stretch']})" if t["stretch"] else ""
        print(f"TARGET {k} >= {t['target']}{stretch}: {t['value']} "
              f"{'PASS' if t['pass'] else 'MISS'}{' (stretch PASS)' if t['stretch_pass'] else ''}")
    print(f"embedding_ms = {out['embedding_ms']}")
    for n, p in per.items():
        print(f"  {n} embedding stages (ms/step): {p['embedding_stages_ms']}")
    if out["cosparse_breakdown_ms"]:
        print(f"cosparse breakdown (ms/step, inline, timers on internals): {out['cosparse_breakdown_ms']}")
    print(f"wall {out['wall_s']} s; loadavg start {out['machine']['loadavg']} end "
          f"{out['machine']['loadavg_end']}", flush=True)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.worker:
        serve_contender(build_inprocess(a.worker), BenchConfig(**json.loads(a.config_json)))
        return 0
    out = run_bench(a)
    if a.json:
        common.write_json(a.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
