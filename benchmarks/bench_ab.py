"""Architecture A versus architecture B on the foundation workload, in one run.

Workload (full): 8 tables x 1M rows x 64 fp32, one Zipf(1.05) feature each (bags 1..20), batch
4096, DLRM 13-512-256-64 / 512-256-1, row-wise Adagrad on the rows, Adagrad on the dense part;
2 embedded PS shards (real ``cosparse ps serve`` processes), 2 data-worker processes. Both get the
same device tier, 10% of each table's vocabulary; B adds a host tier of 25% over the PS.
``--quick`` shrinks the tables to 100k rows and the batch to 1024.

Each variant is a whole ``Trainer`` run built by ``cosparse compare``'s machinery (``arch-a`` and
``arch-b`` presets over one config): warm-up steps first, until the tiers' hit rates settle, then
the measured steps. It runs at an unlimited link and at ``--link-mbps`` (default 200), where every
simulated link (the trainer host's, each worker node's, the worker->trainer link) is one shared
token bucket. Ratios, all measured in this run:

- ``trainer_ps_bytes_b_over_a``: bytes on the trainer's PS link per step (target <= 0.2);
- ``total_ps_bytes_b_over_a``: trainer plus worker PS bytes per step;
- ``samples_per_s_b_over_a``, per link setting (target >= 1.5 at 200 Mbps);
- ``loss_identical``: both variants trained the same losses, step by step (must be true).

``--sweep`` runs instead A against B one factor at a time from a base point, about 20 cells
(``benchmarks.ab_sweep``): ``b_over_a`` per cell, ``where_b_loses`` with the reason of each, and
an HTML report with the chart beside the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from benchmarks.common import BOTTOM, NUM_DENSE, TOP, Workload, machine_info, write_json
from cosparse.config import config_from_mapping, set_dotted, switch_preset
from cosparse.report.compare import measure, parse_variant


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


def run_pair(raw: dict[str, Any], warmup: int, link_mbps: float | None) -> dict[str, Any]:
    out = {}
    for key, spec in (("a", "arch-a"), ("b", "arch-b")):
        mapping = switch_preset(raw, *parse_variant(spec))
        set_dotted(mapping, {"network.link_mbps": link_mbps})
        cfg = config_from_mapping(mapping)
        t0 = time.perf_counter()
        run = measure(cfg, warmup, spec, lambda m: print(f"  {m}", flush=True))
        run["wall_s"] = time.perf_counter() - t0
        out[key] = run
        print(f"  {spec} @ {link_mbps or 'unlimited'} Mbps: {run['samples_per_s']:,.0f} samples/s, "
              f"trainer<->PS {_trainer_ps(run) / 1e6:.2f} MB/step", flush=True)
    return out


def _trainer_ps(run: dict[str, Any]) -> float:
    b = run["bytes_per_step"]
    return (b["trainer_ps.pull"] or 0) + (b["trainer_ps.push"] or 0)


def _total_ps(run: dict[str, Any]) -> float:
    return _trainer_ps(run) + (run["bytes_per_step"]["worker_ps"] or 0)


def summarize(pairs: dict[str, dict[str, Any]], link_mbps: float) -> dict[str, Any]:
    free, shaped = pairs["unlimited"], pairs[f"{link_mbps:g}mbps"]
    ratios = {
        "trainer_ps_bytes_b_over_a": _trainer_ps(free["b"]) / _trainer_ps(free["a"]),
        "total_ps_bytes_b_over_a": _total_ps(free["b"]) / _total_ps(free["a"]),
        "samples_per_s_b_over_a.unlimited": free["b"]["samples_per_s"] / free["a"]["samples_per_s"],
        f"samples_per_s_b_over_a.{link_mbps:g}mbps":
            shaped["b"]["samples_per_s"] / shaped["a"]["samples_per_s"],
        "loss_identical": all(p["a"]["losses"] == p["b"]["losses"] for p in pairs.values()),
    }
    ratios["targets"] = {
        "trainer_ps_bytes_b_over_a<=0.2": ratios["trainer_ps_bytes_b_over_a"] <= 0.2,
        f"samples_per_s_b_over_a.{link_mbps:g}mbps>=1.5":
            ratios[f"samples_per_s_b_over_a.{link_mbps:g}mbps"] >= 1.5,
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
    a = p.parse_args(argv)
    if a.sweep:
        return run_sweep(a)
    raw, warmup, steps = workload(a.quick, a.tiny)
    t0 = time.perf_counter()
    pairs = {}
    for label, mbps in (("unlimited", None), (f"{a.link_mbps:g}mbps", a.link_mbps)):
        print(f"link {label}:", flush=True)
        pairs[label] = run_pair(raw, warmup, mbps)
    ratios = summarize(pairs, a.link_mbps)
    for pair in pairs.values():
        for run in pair.values():
            run.pop("losses_full", None)
    out = {"benchmark": "bench_ab", "mode": "tiny" if a.tiny else "quick" if a.quick else "full",
           "workload": {"vocab": raw["data"]["synthetic"]["vocab_size"],
                        "batch": raw["data"]["batch_size"], "tables": len(raw["tables"]),
                        "dim": raw["tables"][0]["dim"], "warmup_steps": warmup,
                        "measured_steps": steps, "device_rows": raw["store"]["device"]["rows"],
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
