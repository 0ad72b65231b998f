"""The live tuning agent (``train.autotune``) from bench_tune's poor start, in one run.

The same workload and start as ``bench_tune`` (architecture B over two embedded PS shards, a
device tier of 1% and a host tier of 5% of each vocabulary, LRU, lookahead 0, one data worker),
trained twice on the same batches: once as it is, once with the live agent on every live knob
(lookahead, horizon, data workers, prefetch depth, ``publish_every``, the device and host rows
within bench_tune's budgets: 10% and 25% of the vocabularies' bytes, and the supply path between
B's workers' rows and the trainer's own pulls), in windows of 8 intervals (80 steps; quick 40).

Figures, all from this run:
- ``live_speedup``: the agent's run over the plain run, interval for interval, the median over
  the last quarter of the run (goal >= 1.2: where the agent has settled);
- ``whole_run_speedup``: the plain run's time over the agent's, every interval counted (its
  trials and their restarts too);
- ``bit_identical``: both runs trained the same losses and rows (goal true);
- ``changes``: what the agent tried, in order, and whether it kept it.

``--quick``: 320 steps of 512 samples, about 2 minutes on 2 cores (two runs of architecture B
long enough for the agent's windows: like bench_tune's, this quick run is longer than 60 s);
full: 1,200 steps of 1,024.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_tune import BATCH, TABLES, VOCAB, poor_start
from benchmarks.common import machine_info, write_json

ROW_BYTES = 4 * (16 + 1)
KNOBS = ["supply.lookahead", "supply.horizon", "data.workers", "data.queue_depth",
         "supply.publish_every", "store.device.rows", "store.host.rows", "supply.path"]


def _run(raw: dict[str, Any], agent_journal: Path | None) -> dict[str, Any]:
    from cosparse.autotune.live import LiveAgent
    from cosparse.autotune.trial_run import row_digest
    from cosparse.config import config_from_mapping
    from cosparse.train.trainer import Trainer

    cfg = config_from_mapping(copy.deepcopy(raw))
    agent = None if agent_journal is None else LiveAgent(cfg, agent_journal,
                                                         log=lambda m: print(f"  {m}"))
    intervals: list[dict[str, Any]] = []

    def seen(rec: dict[str, Any]) -> Any:
        intervals.append(rec)
        return agent(rec) if agent is not None else None

    t0 = time.perf_counter()
    trainer = Trainer(cfg, log=lambda m: None, on_interval=seen)
    try:
        trainer.run(evaluate=False)
        return {"sps": [r["samples_per_s"] for r in intervals], "losses": list(trainer.losses),
                "rows": row_digest(trainer.ec.export_rows()), "wall_s": time.perf_counter() - t0,
                "changes": agent.changes if agent is not None else [],
                "settled": agent.current if agent is not None else {}}
    finally:
        trainer.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="320 steps of 512 samples")
    p.add_argument("--json", default=None, help="write the results here")
    a = p.parse_args(argv)
    # windows of 8 intervals: a one-sided rank test of 7 against 8 short intervals separates
    # a 1.2x change from this machine's interval-to-interval noise, 3 against 4 long ones do not
    steps, batch, log_every = (320, 512, 5) if a.quick else (1200, BATCH, 10)
    raw = poor_start()
    raw["data"]["batch_size"] = batch
    raw["data"]["synthetic"]["num_batches"] = steps + 8  # one epoch covers the run
    raw["train"].update(steps=steps, log_every=log_every, progress=False)
    tuned = copy.deepcopy(raw)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_tune_live.") as tmp:
        tuned["train"]["autotune"] = {
            "knobs": KNOBS, "every": 8 * log_every, "journal": str(Path(tmp) / "journal.log"),
            "device_budget": TABLES * (VOCAB // 10) * ROW_BYTES,
            "host_budget": TABLES * (VOCAB // 4) * ROW_BYTES}
        plain = _run(raw, None)
        print(f"plain: {statistics.median(plain['sps']):,.0f} samples/s", flush=True)
        live = _run(tuned, Path(tmp) / "journal.log")
    ratios = [b / p for p, b in zip(plain["sps"], live["sps"], strict=True)]
    tail = ratios[-max(1, len(ratios) // 4):]
    res = {
        "benchmark": "bench_tune_live", "mode": "quick" if a.quick else "full",
        "machine": machine_info(), "wall_s": time.perf_counter() - t0,
        "workload": {"vocab": VOCAB, "tables": TABLES, "batch": batch, "steps": steps,
                     "log_every": log_every, "every": 8 * log_every, "knobs": KNOBS},
        "live_speedup": statistics.median(tail),
        # the whole run, trials and restarts included: plain's time over the live run's
        "whole_run_speedup": sum(1 / v for v in plain["sps"]) / sum(1 / v for v in live["sps"]),
        "speedup_by_interval": ratios,
        "bit_identical": plain["losses"] == live["losses"] and plain["rows"] == live["rows"],
        "changes": [{k: c[k] for k in ("step", "knob", "from", "to", "gain", "p_value", "kept")}
                    for c in live["changes"]],
        "settled": live["settled"],
        "plain_samples_per_s": plain["sps"], "live_samples_per_s": live["sps"],
    }
    res["targets"] = {"live_speedup>=1.2": res["live_speedup"] >= 1.2,
                      "bit_identical": res["bit_identical"]}
    print({k: res[k] for k in ("live_speedup", "whole_run_speedup", "bit_identical", "settled",
                               "targets")})
    if a.json:
        write_json(a.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
