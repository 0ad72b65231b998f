"""Where architecture B loses: A against B one factor at a time from a base point
(``bench_ab.py --sweep``).

The base point: the foundation workload (8 Zipf(1.05) tables, DLRM, 2 embedded PS shards, 2 data
workers), a device tier of 10% of each table's rows, an unlimited link. Each cell changes one
factor, and runs A (``arch-a``) and B (``arch-b``) there, each a whole ``Trainer`` run (warm-up,
then measured steps, as ``bench_ab``):

- ID locality: Zipf 0.6, 0.8, 1.2 and 1.4, and a working set that fits the device tier (every
  table's vocabulary no larger than its device rows);
- link bandwidth: 10 Gbit/s, 1 Gbit/s, 200 Mbit/s (the base is unlimited);
- device tier share: 1%, 5%, 25%, 50% (the base is 10%);
- sequence length: 1, 10, 100 and 1,000 events, on the DIN synthetic-sequence workload.

``--quick`` runs 9 of the 17 cells (the base and each factor's extremes) on smaller tables.
Each cell reports ``b_over_a`` (samples/s). ``where_b_loses`` lists the cells where A is faster,
each with the reason read from both runs' counters: the stages in which B spent more time per
step than A, how many cold rows the workers had to deliver (the device hit rate), the workers'
wasted and stale rows, and the link.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks.common import NUM_DENSE, din_model_and_tables
from cosparse.config import config_from_mapping, set_dotted, switch_preset
from cosparse.report.compare import measure, parse_variant

ALPHA, SHARE = 1.05, 0.10


@dataclass(frozen=True)
class Size:
    """The sweep's workload size: rows per table, batch, steps (warm-up, measured), DIN's."""

    vocab: int
    batch: int
    dim: int
    warmup: int
    steps: int
    din_batch: int


QUICK = Size(vocab=50_000, batch=256, dim=16, warmup=2, steps=10, din_batch=128)
TINY = Size(vocab=20_000, batch=128, dim=8, warmup=1, steps=3, din_batch=64)  # the smoke test
FULL = Size(vocab=200_000, batch=512, dim=32, warmup=15, steps=25, din_batch=256)


@dataclass(frozen=True)
class Cell:
    name: str
    factor: str  # locality, link, device_share, sequence_length (base: the base point)
    value: Any
    alpha: float = ALPHA
    link_mbps: float | None = None
    share: float = SHARE
    fits: bool = False
    seq_len: int | None = None  # DIN synthetic sequences
    quick: bool = False  # one of --quick's cells (each factor's base and extremes)


def cells(quick: bool = False) -> list[Cell]:
    """Every cell of the sweep (``quick``: the base and each factor's extremes, 9 cells)."""
    out = [Cell("base", "base", None, quick=True)]
    out += [Cell(f"zipf_{a:g}", "locality", a, alpha=a, quick=a in (0.6, 1.4))
            for a in (0.6, 0.8, 1.2, 1.4)]
    out += [Cell("fits_device", "locality", "working set fits the device tier", fits=True,
                 quick=True)]
    out += [Cell(f"link_{m:g}mbps", "link", m, link_mbps=m, quick=m == 200)
            for m in (10_000, 1_000, 200)]
    out += [Cell(f"device_{s:.0%}", "device_share", s, share=s, quick=s in (0.01, 0.5))
            for s in (0.01, 0.05, 0.25, 0.5)]
    out += [Cell(f"din_seq_{n}", "sequence_length", n, seq_len=n, quick=n in (1, 1000))
            for n in (1, 10, 100, 1000)]
    return [c for c in out if c.quick or not quick]


def dlrm_mapping(size: Size, c: Cell) -> dict[str, Any]:
    vocab = max(1000, int(size.vocab * c.share)) if c.fits else size.vocab
    device = vocab if c.fits else max(1, int(size.vocab * c.share))
    feats = [f"C{i}" for i in range(1, 9)]
    return {
        "data": {"reader": "synthetic", "batch_size": size.batch, "queue_depth": 2,
                 "workers": 1 if size is TINY else 2,
                 "synthetic": {"num_features": 8, "num_dense": NUM_DENSE, "vocab_size": vocab,
                               "alpha": c.alpha, "bag_min": 1, "bag_max": 4, "seed": 5,
                               "num_batches": size.warmup + size.steps + 8, "eval_batches": 1}},
        "model": {"kind": "dlrm", "bottom": [64, size.dim], "top": [64, 1],
                  "dense_optimizer": {"kind": "adagrad", "lr": 0.05}},
        "tables": [{"name": f"t{i}", "dim": size.dim, "features": [f], "seed": i,
                    "optimizer": {"kind": "rowwise_adagrad", "lr": 0.05}}
                   for i, f in enumerate(feats)],
        "store": {"device": {"rows": device}, "host": {"rows": max(device, vocab // 4)},
                  "remote": {"embedded": True, "num_shards": 2}},
        "train": {"steps": size.warmup + size.steps, "threads": 2, "seed": 1,
                  "progress": False},
    }


def din_mapping(size: Size, c: Cell) -> dict[str, Any]:
    assert c.seq_len is not None
    vocab = 500_000
    return {
        # (long histories: fewer samples a batch, so that one batch's rows fit the device tier)
        "data": {"reader": "synthetic_sequences", "workers": 1 if size is TINY else 2,
                 "batch_size": size.din_batch if c.seq_len <= 100 else size.din_batch // 8,
                 "eval_fraction": 0.1,
                 "events": {"synthetic": {"seq_len": c.seq_len, "vocab_size": vocab,
                                          "num_cates": 1000, "seed": 3}}},
        **din_model_and_tables(c.seq_len),
        "store": {"device": {"rows": int(vocab * SHARE)}, "host": {"rows": vocab // 4},
                  "remote": {"embedded": True, "num_shards": 2}},
        "train": {"steps": size.warmup + size.steps, "threads": 2, "seed": 1,
                  "progress": False},
    }


@dataclass
class CellResult:
    cell: Cell
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    error: str | None = None

    @property
    def b_over_a(self) -> float | None:
        if self.error or not self.runs:
            return None
        return self.runs["b"]["samples_per_s"] / self.runs["a"]["samples_per_s"]


def run_cell(size: Size, c: Cell, log: Any = print) -> CellResult:
    raw = din_mapping(size, c) if c.seq_len is not None else dlrm_mapping(size, c)
    out = CellResult(c)
    for key, spec in (("a", "arch-a"), ("b", "arch-b")):
        mapping = switch_preset(copy.deepcopy(raw), *parse_variant(spec))
        set_dotted(mapping, {"network.link_mbps": c.link_mbps})
        t0 = time.perf_counter()
        try:
            run = measure(config_from_mapping(mapping), size.warmup, spec, lambda m: None)
        except Exception as e:  # noqa: BLE001 - a cell that cannot run is reported, not fatal
            out.error = f"{spec}: {type(e).__name__}: {e}"
            log(f"  {c.name}: {out.error}")
            return out
        run["wall_s"] = time.perf_counter() - t0
        run.pop("losses", None)
        out.runs[key] = run
    log(f"  {c.name}: A {out.runs['a']['samples_per_s']:,.0f}, B "
        f"{out.runs['b']['samples_per_s']:,.0f} samples/s: b_over_a {out.b_over_a:.2f}")
    return out


def _ps_bytes(run: dict[str, Any]) -> float:
    b = run["bytes_per_step"]
    return (b.get("trainer_ps.pull") or 0) + (b.get("trainer_ps.push") or 0)


def why_b_loses(r: CellResult) -> str:
    """The reason A was faster in this cell, from both runs' counters."""
    a, b = r.runs["a"], r.runs["b"]
    parts = []
    extra = sorted(((b["stage_ms"].get(k, 0.0) - a["stage_ms"].get(k, 0.0), k)
                    for k in set(a["stage_ms"]) | set(b["stage_ms"])), reverse=True)
    grown = [f"{k} +{d:.1f} ms/step (A {a['stage_ms'].get(k, 0.0):.1f}, B "
             f"{b['stage_ms'].get(k, 0.0):.1f})" for d, k in extra[:2] if d > 0.05]
    if grown:
        parts.append("B spent more in " + ", ".join(grown))
    hit = a.get("hit_rate", {}).get("device")
    if hit is not None and hit > 0.8:
        parts.append(f"A's device hit rate is {hit:.2f}: few cold rows are left for B's workers "
                     "to deliver, so B's extra work (dedup and filter in the workers, delivery, "
                     "host tier) does not pay")
    if r.cell.link_mbps is None:
        parts.append(f"the link is unlimited: A's own pulls and pushes "
                     f"({_ps_bytes(a) / 1e6:.2f} MB/step) cost it little")
    wasted = b.get("wasted_bytes_per_step.worker_ps") or 0.0
    worker = (b["bytes_per_step"].get("worker_ps") or 0.0)
    if worker and wasted / worker > 0.1:
        parts.append(f"{wasted / worker:.0%} of the workers' PS bytes were delivered rows the "
                     "trainer discarded")
    if b.get("stale_drops"):
        parts.append(f"{b['stale_drops']:.0f} delivered rows dropped as stale")
    if b.get("fallbacks"):
        parts.append(f"B fell back to the trainer's pulls {b['fallbacks']:.0f} times")
    return "; ".join(parts) or "no counter separates them (within noise)"


def summarize(results: list[CellResult]) -> dict[str, Any]:
    table = {}
    loses = []
    for r in results:
        table[r.cell.name] = {"factor": r.cell.factor, "value": r.cell.value,
                              "b_over_a": r.b_over_a, "error": r.error,
                              "samples_per_s": {k: v["samples_per_s"] for k, v in r.runs.items()},
                              "trainer_ps_bytes_b_over_a": (
                                  _ps_bytes(r.runs["b"]) / _ps_bytes(r.runs["a"])
                                  if len(r.runs) == 2 and _ps_bytes(r.runs["a"]) else None)}
        if r.b_over_a is not None and r.b_over_a < 1.0:
            loses.append({"cell": r.cell.name, "factor": r.cell.factor, "value": r.cell.value,
                          "b_over_a": r.b_over_a, "reason": why_b_loses(r)})
    return {"cells": table, "where_b_loses": loses}


def sweep(quick: bool, only: list[str] | None = None, log: Any = print,
          tiny: bool = False) -> dict[str, Any]:
    size = TINY if tiny else QUICK if quick else FULL
    chosen = [c for c in cells(quick and only is None) if only is None or c.name in only]
    t0 = time.perf_counter()
    results = []
    for i, c in enumerate(chosen, 1):
        log(f"sweep cell {i}/{len(chosen)}: {c.name} ({c.factor})")
        results.append(run_cell(size, c, log))
    out = summarize(results)
    out.update({"size": size.__dict__, "wall_s": time.perf_counter() - t0,
                "runs": {r.cell.name: r.runs for r in results}})
    return out
