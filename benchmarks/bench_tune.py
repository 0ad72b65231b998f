"""The offline tuning agent against a deliberately poor start, in one run.

Workload: the engine's synthetic reader (8 tables of a 200k-row vocabulary each, one Zipf 1.05
feature of 1-4 IDs per table, 16 wide, batch 1024, DLRM 64-16 / 64-1), architecture B over
two embedded PS shards. The start is poor on purpose: a device tier of 1% of each vocabulary,
a host tier of 5%, both LRU, lookahead 0 (planning inline) and one data worker. Budgets: the
device tiers at most 10% of the vocabularies' bytes, the host tiers at most 25% (a path that
keeps every row in this process counts the whole vocabulary). ``cosparse tune``'s agent
searches the exact knobs, supply path among them (8 trials with ``--quick``, 30 in full),
then the decision is measured again against the start in alternating rounds (start, best,
start, ...), each a fresh trial process on the same batches.

Figures, all from this run:
- ``speedup_over_start``: the best configuration's median window throughput over the start's,
  paired round by round (goal >= 1.3 full, >= 1.2 ``--quick``), and ``search_speedup``, the
  agent's own A/B/A figure for it;
- ``budget_violations``: budgets the decision breaks (goal 0);
- ``semantic_knobs_applied``: semantic knobs the decision changed (goal 0 without
  ``--allow semantic``);
- ``replay_matches``: ``--replay``'s decision from the journal equals the search's;
- ``exactness_vetoes``: trials whose losses or rows differed from the start's (engine bugs).

``--quick``: 8 trials, 2 re-measuring rounds (< 6 min). Full: 30 trials, 5 rounds.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import machine_info, write_json
from cosparse.autotune.agent import Window

VOCAB = 200_000  # rows of each table
STEADY = Window(warmup_steps=400, windows=4, window_steps=50)  # past the tiers' warm-up
TABLES = 8
BATCH = 1024


def poor_start() -> dict[str, Any]:
    return {
        "data": {"reader": "synthetic", "batch_size": BATCH, "workers": 1,
                 "synthetic": {"num_features": TABLES, "num_dense": 13, "vocab_size": VOCAB,
                               "alpha": 1.05, "bag_min": 1, "bag_max": 4, "seed": 3,
                               "num_batches": 400, "eval_batches": 1}},
        "model": {"kind": "dlrm", "bottom": [64, 16], "top": [64, 1],
                  "dense_optimizer": {"kind": "adagrad", "lr": 0.05}},
        "tables": [{"name": f"t{i}", "dim": 16, "features": [f"C{i}"], "seed": i,
                    "optimizer": {"kind": "rowwise_adagrad", "lr": 0.05}}
                   for i in range(1, TABLES + 1)],
        "store": {"device": {"rows": VOCAB // 100, "policy": "lru"},
                  "host": {"rows": VOCAB // 20, "policy": "lru", "spill": True,
                           "spill_to": "remote"},
                  "remote": {"num_shards": 2}},
        "supply": {"path": "collaborative", "lookahead": 0},
        "train": {"steps": 100, "threads": 2},
    }


def steady(path: Path) -> int:
    """The decision in a saved result against the start, each trained long past the tiers'
    warm-up: the trials' short windows start while the tiers still fill, and a tier with free
    slots is fast for a while whatever its size is worth."""
    from cosparse.autotune.knobs import apply
    from cosparse.autotune.measure import measure

    res = json.loads(path.read_text())
    raw = poor_start()
    raw["data"]["synthetic"]["num_batches"] = STEADY.warmup_steps + 2 * STEADY.windows * \
        STEADY.window_steps
    out = {}
    with tempfile.TemporaryDirectory(prefix="bench_tune.steady.") as tmp:
        for name, params in (("start", {}), ("best", res["decision"]["params"])):
            m = measure(STEADY.config(apply(raw, params)), STEADY.warmup_steps,
                        Path(tmp) / name, 900.0, window_steps=STEADY.window_steps)
            if m.error:
                raise RuntimeError(f"steady-state {name} failed: {m.error}")
            out[name] = m.samples_per_s
            print(f"steady state, {name}: {m.samples_per_s:,.0f} samples/s", flush=True)
    res["steady_state"] = {"window": vars(STEADY), "start_samples_per_s": out["start"],
                           "best_samples_per_s": out["best"],
                           "speedup": out["best"] / out["start"]}
    write_json(str(path), res)
    return 0


def main(argv: list[str] | None = None) -> int:
    from cosparse.autotune.agent import load, replay, tune
    from cosparse.autotune.knobs import apply, exact_knobs
    from cosparse.autotune.measure import measure
    from cosparse.autotune.output import write_outputs
    from cosparse.autotune.types import Budgets
    from cosparse.config import config_from_mapping

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="8 trials, 2 rounds")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--out", default=None, help="keep the agent's journal and report here")
    p.add_argument("--steady", default=None, metavar="RESULT_JSON",
                   help="instead: measure a saved run's decision and start at steady state "
                        f"(after {STEADY.warmup_steps} steps) and add it to that JSON")
    a = p.parse_args(argv)
    if a.steady:
        return steady(Path(a.steady))
    trials, rounds = (8, 2) if a.quick else (30, 5)
    # windows of ~1 s: the quick run's 17 trials and 2 rounds fit its 6 minutes
    window = Window(warmup_steps=5, windows=5 if a.quick else 6, window_steps=12)
    raw = poor_start()
    knobs = exact_knobs(config_from_mapping(copy.deepcopy(raw)))
    row_bytes = 4 * (16 + 1)  # a row and its row-wise Adagrad state
    budgets = Budgets(device_bytes=TABLES * (VOCAB // 10) * row_bytes,
                      host_bytes=TABLES * (VOCAB // 4) * row_bytes)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_tune.") as tmp_s:
        out = Path(a.out) if a.out else Path(tmp_s) / "tune"
        decision = tune(raw, knobs, budgets, out, trials, window,
                        log=lambda m: print(f"  {m}", flush=True))
        again, recorded = replay(out / "journal.log")
        study = load(out / "journal.log")
        write_outputs(study, decision, out)
        vetoes = sum(1 for t in study.get_trials(deepcopy=False) if t.user_attrs.get("veto"))
        best = window.config(apply(raw, decision["params"]))
        start = window.config(raw)
        pairs = []
        for i in range(rounds):  # start and best alternately, each a fresh trial process
            s = measure(start, window.warmup_steps, Path(tmp_s) / f"start{i}", 600.0,
                        window_steps=window.window_steps)
            b = measure(best, window.warmup_steps, Path(tmp_s) / f"best{i}", 600.0,
                        window_steps=window.window_steps)
            if s.error or b.error:
                raise RuntimeError(f"re-measuring failed: {s.error or b.error}")
            pairs.append(b.samples_per_s / s.samples_per_s)
            print(f"round {i}: start {s.samples_per_s:,.0f}, best {b.samples_per_s:,.0f} "
                  f"samples/s ({pairs[-1]:.3f}x)", flush=True)
    violations = sum(1 for v in budgets.violations(decision["figures"]) if v > 0)
    semantic = sum(1 for k in knobs if k.kind == "semantic"
                   and decision["params"].get(k.key, k.choices[0]) != k.choices[0])
    res = {
        "benchmark": "bench_tune", "mode": "quick" if a.quick else "full",
        "machine": machine_info(), "wall_s": time.perf_counter() - t0,
        "workload": {"vocab": VOCAB, "tables": TABLES, "batch": BATCH,
                     "start_device_rows": VOCAB // 100,
                     "device_budget_bytes": budgets.device_bytes, "trials": trials,
                     "rounds": rounds, "window": vars(window)},
        "decision": decision,
        "speedup_over_start": statistics.median(pairs),
        "speedup_rounds": pairs,
        "search_speedup": decision["speedup"],
        "budget_violations": violations,
        "semantic_knobs_applied": semantic,
        "replay_matches": again == recorded,
        "exactness_vetoes": vetoes,
    }
    goal = 1.2 if a.quick else 1.3
    res["targets"] = {f"speedup_over_start>={goal}": res["speedup_over_start"] >= goal,
                      "budget_violations==0": violations == 0,
                      "replay_matches": res["replay_matches"]}
    print({k: v for k, v in res.items() if k not in ("machine", "workload")})
    if a.json:
        write_json(a.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
