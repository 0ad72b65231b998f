"""Architecture A versus architecture B on the foundation workload, in one run.

Workload (full): 8 tables x 1M rows x 64 fp32, one Zipf(1.05) feature each (bags 1..20), batch
4096, DLRM 13-512-256-64 / 512-256-1, row-wise Adagrad on the rows, Adagrad on the dense part;
2 embedded PS shards (real ``cosparse ps serve`` processes), 2 data-worker processes. Both get the
same device tier, 10% of each table's vocabulary; B adds a host tier of 25% over the PS.
``--quick`` shrinks the tables to 100k rows and the batch to 1024.

Each variant is a whole ``Trainer`` built by ``cosparse compare``'s machinery (``arch-a`` and
``arch-b`` presets over one config) in a worker process of its own: warm-up steps first, until the
tiers' hit rates settle, then ``--rounds`` alternating rounds (order rotated) of measured steps,
the workload's measured steps shared out over the rounds, on trainers that live across them. It
runs at an unlimited link and at ``--link-mbps`` (default 200), where every simulated link (the
trainer host's, each worker node's, the worker->trainer link) is one shared token bucket. Figures,
all measured in this run (issue 17's targets, on the paired figures):

- ``trainer_ps_bytes_b_over_a``: bytes on the trainer's PS link per step (target <= 0.1);
- ``total_ps_bytes_b_over_a``: trainer plus worker PS bytes per step;
- ``samples_per_s_b_over_a.<link>``: B's median samples/s over A's, per link setting, and
  ``samples_per_s_b_over_a_paired.<link>``, the median of the per-round ratios (targets: >= 1.0
  unlimited, >= 3.0 at 200 Mbps);
- ``loss_identical``: both variants trained the same losses, step by step (must be true).

``--sweep`` runs instead A against B one factor at a time from a base point, about 20 cells
(``benchmarks.ab_sweep``): ``b_over_a`` per cell, ``where_b_loses`` with the reason of each, and
an HTML report with the chart beside the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

from benchmarks.common import (
    BOTTOM,
    NUM_DENSE,
    TOP,
    Worker,
    Workload,
    close_all,
    machine_info,
    rotation,
    serve,
    write_json,
)
from cosparse.config import config_from_mapping, set_dotted, switch_preset
from cosparse.report.compare import measure_call, measuring_trainer, parse_variant


def workload(quick: bool, tiny: bool) -> tuple[dict[str, Any], int, int]:
    """(config mapping, warm-up steps, measured steps): benchmarks.common's workload (sizes, Zipf,
    bags, model) as a trainer config over the synthetic reader, whose generator is the engine's."""
    w = Workload()
    vocab = 20_000 if tiny else 100_000 if quick else w.rows
    batch = 256 if tiny else 1024 if quick else w.batch
    warmup, steps = (4, 6) if tiny else (6, 8) if quick else (40, 40)
    dim = 16 if tiny else w.dim
    feats = [f"C{i}" for i in range(1, w.tables + 1)]
    raw = {
        "data": {"reader": "synthetic", "batch_size": batch, "workers": 2, "queue_depth": 2,
                 "synthetic": {"num_features": w.tables, "num_dense": NUM_DENSE, "vocab_size": vocab,
                               "alpha": w.alpha, "bag_min": 1, "bag_max": w.max_bag, "seed": 5,
                               "num_batches": warmup + steps + 8, "eval_batches": 2}},
        "model": {"kind": "dlrm", "bottom": [*BOTTOM, dim] if not tiny else [32, dim],
                  "top": list(TOP) if not tiny else [32, 1],
                  "dense_optimizer": {"kind": "adagrad", "lr": w.lr}},
        "tables": [{"name": f"t{i}", "dim": dim, "features": [f], "seed": i,
                    "optimizer": {"kind": "rowwise_adagrad", "lr": 0.05}}
                   for i, f in enumerate(feats)],
        "store": {"device": {"rows": vocab // 10}, "host": {"rows": vocab // 4},
                  "remote": {"embedded": True, "num_shards": 2}},
        "train": {"steps": warmup + steps, "threads": 2, "seed": 1},
    }
    return raw, warmup, steps


VARIANTS = {"a": "arch-a", "b": "arch-b"}


def variant_config(raw: dict[str, Any], key: str, link_mbps: float | None, total_steps: int
                   ) -> Any:
    mapping = switch_preset(raw, *parse_variant(VARIANTS[key]))
    set_dotted(mapping, {"network.link_mbps": link_mbps, "train.steps": total_steps})
    mapping["data"]["synthetic"]["num_batches"] = total_steps + 8
    return config_from_mapping(mapping)


class Variant:
    """One variant's trainer in a worker process, warmed up once and measured per call."""

    def __init__(self, cfg: Any, label: str, warmup: int) -> None:
        self.label = label
        self.trainer = measuring_trainer(cfg, label, lambda m: print(m, file=sys.stderr))
        if warmup:
            self.trainer.run(steps=warmup, evaluate=False)

    def measure(self, steps: int, last: bool) -> dict[str, Any]:
        return measure_call(self.trainer, self.label, steps, evaluate=last)

    def close(self) -> None:
        self.trainer.close()


def round_steps(steps: int, rounds: int) -> int:
    """Measured steps per round: the workload's measured steps shared out over the rounds."""
    return max(2, steps // rounds)


def worker_main(a: argparse.Namespace) -> None:
    raw, warmup, steps = workload(a.quick, a.tiny)
    total = warmup + a.rounds * round_steps(steps, a.rounds)

    def setup() -> tuple[Variant, dict[str, Any]]:
        label = f"{VARIANTS[a.worker]} @ {a.link_mbps or 'unlimited'} Mbps"
        link = a.link_mbps or None  # (0: unlimited)
        return Variant(variant_config(raw, a.worker, link, total), label, warmup), {}

    serve(setup, {"run": lambda v, cmd: v.measure(cmd["steps"], cmd["last"])})


def run_link(a: argparse.Namespace, link_mbps: float | None, steps: int) -> dict[str, Any]:
    """Both variants at one link setting, in alternating rounds: each round measures ``steps``
    more steps of each (order rotated), on trainers that live across the rounds."""
    args = [*(["--quick"] if a.quick else []), *(["--tiny"] if a.tiny else []),
            "--rounds", str(a.rounds), "--link-mbps", str(link_mbps or 0)]  # (0: unlimited)
    workers = {k: Worker(k, "benchmarks.bench_ab", ["--worker", k, *args], dict(os.environ))
               for k in VARIANTS}
    calls: dict[str, list[dict[str, Any]]] = {k: [] for k in VARIANTS}
    try:
        t0 = time.perf_counter()
        for w in workers.values():  # (they set up and warm up concurrently, untimed)
            w.ready = w.recv()
        print(f"  both variants built and warmed up in {time.perf_counter() - t0:.1f} s",
              flush=True)
        for r in range(a.rounds):
            for k in rotation(VARIANTS, r):
                res = workers[k].call(cmd="run", steps=steps, last=r == a.rounds - 1)
                calls[k].append(res)
                print(f"  round {r} {VARIANTS[k]} @ {link_mbps or 'unlimited'} Mbps: "
                      f"{res['samples_per_s']:,.0f} samples/s, trainer<->PS "
                      f"{_trainer_ps(res) / 1e6:.2f} MB/step", flush=True)
    finally:
        close_all(workers)
    return {k: merge_rounds(calls[k]) for k in VARIANTS}


def merge_rounds(calls: list[dict[str, Any]]) -> dict[str, Any]:
    """One variant's run over the rounds: samples/s the median (``samples_per_s_rounds`` each
    round's), bytes per step over all measured steps, the rest from the last round (its
    ``losses`` cover every step)."""
    run = dict(calls[-1])
    n = sum(c["measured_steps"] for c in calls)
    run["samples_per_s_rounds"] = [c["samples_per_s"] for c in calls]
    run["samples_per_s"] = statistics.median(run["samples_per_s_rounds"])
    run["bytes_per_step"] = {
        link: (sum(c["bytes_per_step"][link] * c["measured_steps"] for c in calls) / n
               if all(c["bytes_per_step"][link] is not None for c in calls) else None)
        for link in run["bytes_per_step"]}
    run["measured_steps"] = n
    return run


def _trainer_ps(run: dict[str, Any]) -> float:
    b = run["bytes_per_step"]
    return (b["trainer_ps.pull"] or 0) + (b["trainer_ps.push"] or 0)


def _total_ps(run: dict[str, Any]) -> float:
    return _trainer_ps(run) + (run["bytes_per_step"]["worker_ps"] or 0)


def _paired(pair: dict[str, Any]) -> float:
    """The median of the per-round ratios B / A."""
    return statistics.median(b / a for a, b in zip(pair["a"]["samples_per_s_rounds"],
                                                    pair["b"]["samples_per_s_rounds"], strict=True))


def summarize(pairs: dict[str, dict[str, Any]], link_mbps: float) -> dict[str, Any]:
    free, shaped = pairs["unlimited"], pairs[f"{link_mbps:g}mbps"]
    shaped_key = f"samples_per_s_b_over_a.{link_mbps:g}mbps"
    ratios = {
        "trainer_ps_bytes_b_over_a": _trainer_ps(free["b"]) / _trainer_ps(free["a"]),
        "total_ps_bytes_b_over_a": _total_ps(free["b"]) / _total_ps(free["a"]),
        "samples_per_s_b_over_a.unlimited": free["b"]["samples_per_s"] / free["a"]["samples_per_s"],
        shaped_key: shaped["b"]["samples_per_s"] / shaped["a"]["samples_per_s"],
        "samples_per_s_b_over_a_paired.unlimited": _paired(free),
        f"samples_per_s_b_over_a_paired.{link_mbps:g}mbps": _paired(shaped),
        "loss_identical": all(p["a"]["losses"] == p["b"]["losses"] for p in pairs.values()),
    }
    ratios["targets"] = {  # issue 17's, on the paired figures
        "trainer_ps_bytes_b_over_a<=0.1": ratios["trainer_ps_bytes_b_over_a"] <= 0.1,
        "samples_per_s_b_over_a_paired.unlimited>=1.0":
            ratios["samples_per_s_b_over_a_paired.unlimited"] >= 1.0,
        f"samples_per_s_b_over_a_paired.{link_mbps:g}mbps>=3.0":
            ratios[f"samples_per_s_b_over_a_paired.{link_mbps:g}mbps"] >= 3.0,
        "loss_identical": ratios["loss_identical"],
    }
    return ratios


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="100k-row tables, batch 1024 (< 60 s)")
    p.add_argument("--tiny", action="store_true", help="smallest run, for the smoke test")
    p.add_argument("--link-mbps", type=float, default=200.0)
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--sweep", action="store_true",
                   help="A against B one factor at a time (locality, link, device share, "
                        "sequence length): where B loses")
    p.add_argument("--cells", default=None, help="with --sweep: only these cells (comma-separated)")
    p.add_argument("--rounds", type=int, default=None,
                   help="alternating rounds per link (default 4; --quick, --tiny: 1)")
    p.add_argument("--worker", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.sweep:
        return run_sweep(a)
    a.rounds = a.rounds or (1 if a.quick or a.tiny else 4)
    if a.worker:
        worker_main(a)
        return 0
    raw, warmup, steps = workload(a.quick, a.tiny)
    t0 = time.perf_counter()
    pairs = {}
    for label, mbps in (("unlimited", None), (f"{a.link_mbps:g}mbps", a.link_mbps)):
        print(f"link {label}:", flush=True)
        pairs[label] = run_link(a, mbps, round_steps(steps, a.rounds))
    ratios = summarize(pairs, a.link_mbps)
    for pair in pairs.values():
        for run in pair.values():
            run.pop("losses_full", None)
    out = {"benchmark": "bench_ab", "mode": "tiny" if a.tiny else "quick" if a.quick else "full",
           "workload": {"vocab": raw["data"]["synthetic"]["vocab_size"],
                        "batch": raw["data"]["batch_size"], "tables": len(raw["tables"]),
                        "dim": raw["tables"][0]["dim"], "warmup_steps": warmup,
                        "measured_steps": round_steps(steps, a.rounds) * a.rounds,
                        "rounds": a.rounds, "device_rows": raw["store"]["device"]["rows"],
                        "host_rows_b": raw["store"]["host"]["rows"], "shards": 2, "workers": 2},
           "machine": {**machine_info(), "cpus": os.cpu_count()},  # cpus: the saved runs' key
           "wall_s": time.perf_counter() - t0, **ratios, "runs": pairs}
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}, indent=1))
    if a.json:
        write_json(a.json, out)
    return 0


def run_sweep(a: argparse.Namespace) -> int:
    from benchmarks.ab_sweep import sweep
    from cosparse.report.sweep_report import write_sweep_report

    out = {"benchmark": "bench_ab_sweep",
           "mode": "tiny" if a.tiny else "quick" if a.quick else "full",
           "machine": {**machine_info(), "cpus": os.cpu_count()},
           **sweep(a.quick, a.cells.split(",") if a.cells else None,
                   lambda m: print(m, flush=True), tiny=a.tiny)}
    print(json.dumps({k: out[k] for k in ("cells", "where_b_loses", "wall_s")}, indent=1))
    if a.json:
        write_json(a.json, out)
        html = write_sweep_report(out, os.path.splitext(a.json)[0] + ".html")
        print(f"wrote {a.json} and {html}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
