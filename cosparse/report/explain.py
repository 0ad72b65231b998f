"""``cosparse explain RUN``: which steps of a run were slow, which stage grew, and why.

It reads the run's step records (``cosparse.train.step_records``) and takes the slow steps:
every step at or above the run's p99 step time, or above ``threshold_ms``, or the steps asked
for. For each it says which stages grew against their median, by how much, and it names the
likely cause from the counters around the step. Each cause is scored in milliseconds it can
explain, so causes compare on one scale; the highest is the likely one, the rest follow.

- ``ps_stall``: a PS request that ended during the step took far longer than that op's median
  (the shard named).
- ``miss_burst``: planning the batch missed many more rows than usual (extra misses times the
  median fill time per miss).
- ``lookahead_shrink``: the device tier could not hold the lookahead window, so the planner
  waited for the trainer to release rows and the trainer waited for its batch.
- ``stale_drop_storm``: architecture B's delivered rows were dropped as stale and fetched again.
- ``fallback``: the supply path fell back to the trainer's own pulls (a restart of the stream).
- ``memory_pressure``: major page faults, or little memory left available.
- ``cpu_contention``: the process's threads waited for a CPU longer than usual, by at least half
  the step's excess over the median: another process on the cores.
- ``slow_data``: the data worker took longer to build the batch and the trainer waited for it.
- ``warm_up``: one of the run's first steps (first fills, compilation).

The planning counters of a batch move on the prefetch thread up to ``lookahead`` steps before
the batch trains, so misses, shrinks and stale drops are looked for in a window of the
``lookahead + 1`` steps before the step and itself; PS requests and run delay in the step's own
wall time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cosparse.train.step_records import STEPS_FILE

WARM_UP_STEPS = 3
_STAGES = ("read", "featurize", "prep", "plan", "fill", "gather", "forward", "backward", "optim",
           "writeback")


class ExplainError(ValueError):
    """The run has no step records to explain (the message says where it looked)."""


@dataclass
class Cause:
    kind: str
    ms: float  # how much of the step's excess this cause can explain
    text: str


@dataclass
class SlowStep:
    step: int
    step_ms: float
    median_ms: float
    grown: list[tuple[str, float, float]]  # (stage, ms, median ms), most grown first
    causes: list[Cause] = field(default_factory=list)

    @property
    def likely(self) -> Cause | None:
        return self.causes[0] if self.causes else None


@dataclass
class Explanation:
    source: Path
    steps: int
    median_ms: float
    p99_ms: float
    rule: str  # which steps count as slow
    slow: list[SlowStep]

    def text(self) -> str:
        lines = [f"{self.source}: {self.steps} steps, median {self.median_ms:.1f} ms, "
                 f"p99 {self.p99_ms:.1f} ms; {len(self.slow)} slow ({self.rule})"]
        for s in self.slow:
            grown = ", ".join(f"{k} {v:.1f} ms (median {m:.1f})" for k, v, m in s.grown[:2])
            lines.append(f"step {s.step}: {s.step_ms:.1f} ms, {s.step_ms / max(s.median_ms, 1e-9):.1f}x "
                         f"the median; grew: {grown or 'no stage'}")
            if not s.causes:
                lines.append("  likely cause: none of the counters explains it")
            for i, c in enumerate(s.causes):
                lines.append(f"  {'likely cause' if i == 0 else 'also'}: {c.kind}: {c.text}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"source": str(self.source), "steps": self.steps, "median_ms": self.median_ms,
                "p99_ms": self.p99_ms, "rule": self.rule,
                "slow": [{"step": s.step, "step_ms": s.step_ms, "median_ms": s.median_ms,
                          "grown": [list(g) for g in s.grown],
                          "likely": s.likely.kind if s.likely else None,
                          "causes": [{"kind": c.kind, "ms": c.ms, "text": c.text}
                                     for c in s.causes]} for s in self.slow]}


def steps_file(run: Path) -> Path:
    """The step records of ``run``: a steps file, or a run directory holding one."""
    if run.is_file():
        return run
    if not run.is_dir():
        raise ExplainError(f"{run}: no such run directory or steps file")
    if (run / STEPS_FILE).is_file():
        return run / STEPS_FILE
    found = sorted(run.glob(f"*.{STEPS_FILE}"))
    if len(found) == 1:
        return found[0]
    if found:
        raise ExplainError(f"{run} holds the step records of {len(found)} models: name one of "
                           f"{', '.join(str(p) for p in found)}")
    raise ExplainError(f"{run}: no {STEPS_FILE} (a run writes its step records beside its "
                       "metrics.jsonl)")


def read_steps(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The header and the step records (of the last run, when a resume appended another)."""
    header: dict[str, Any] = {}
    by_step: dict[int, dict[str, Any]] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ExplainError(f"{path}:{n}: not a JSON line ({e.msg})") from None
        if rec.get("kind") == "header":
            header = rec
        elif "step" in rec:
            by_step[int(rec["step"])] = rec  # (a resumed run's steps replace the earlier ones)
    if not by_step:
        raise ExplainError(f"{path}: no step records")
    return header, [by_step[k] for k in sorted(by_step)]


class _Baseline:
    """The run's medians: step time, each stage, and the counters the causes compare."""

    def __init__(self, recs: list[dict[str, Any]], lookahead: int) -> None:
        self.recs, self.lookahead = recs, lookahead
        self.index = {r["step"]: i for i, r in enumerate(recs)}
        self.step_ms = float(np.median([r["step_ms"] for r in recs]))
        self.stage = {k: float(np.median([r["stages"].get(k, 0.0) for r in recs]))
                      for k in _STAGES}
        self.misses = float(np.median([r.get("plan", {}).get("misses", 0) for r in recs]))
        fill_per_miss = [r["stages"].get("fill", 0.0) / r["plan"]["misses"] for r in recs
                         if r.get("plan", {}).get("misses")]
        self.fill_per_miss = float(np.median(fill_per_miss)) if fill_per_miss else 0.0
        self.run_delay = float(np.median([r["os"]["run_delay_ms"] for r in recs]))
        self.faults = float(np.median([r["os"]["major_faults"] for r in recs]))
        self.shrinks = float(np.median([self._sum(i, "plan", "shrinks")
                                        for i in range(len(recs))]))
        self.stale = float(np.median([self._sum(i, "supply", "stale_drops")
                                      for i in range(len(recs))]))
        lat: dict[str, list[float]] = {}
        for r in recs:
            for op, shards in r.get("ps", {}).items():
                for cell in shards.values():
                    lat.setdefault(op, []).append(cell[1] / max(cell[0], 1))
        self.ps_ms = {op: float(np.median(v)) for op, v in lat.items()}

    def window(self, i: int) -> list[dict[str, Any]]:
        return self.recs[max(0, i - self.lookahead - 1): i + 1]

    def _sum(self, i: int, part: str, key: str) -> float:
        return float(sum(r.get(part, {}).get(key, 0) for r in self.window(i)))


def _causes(b: _Baseline, i: int, header: dict[str, Any]) -> list[Cause]:
    """Every cause the counters around step ``recs[i]`` support, most milliseconds first."""
    r, win = b.recs[i], b.window(i)
    excess = max(0.0, r["step_ms"] - b.step_ms)
    st = r["stages"]
    out: list[Cause] = []
    if r["step"] <= WARM_UP_STEPS:
        out.append(Cause("warm_up", excess, f"step {r['step']} is one of the run's first "
                                             "(first fills, compilation)"))
    falls = [w["fallback"] for w in win if "fallback" in w]
    if falls:
        out.append(Cause("fallback", excess, f"the supply path fell back: {falls[-1]}"))
    worst: tuple[float, str, str] | None = None  # (ms, op, shard)
    for w in (r,):  # (a request ended during the step: one that held the step up did)
        for op, shards in w.get("ps", {}).items():
            for shard, cell in shards.items():
                if worst is None or cell[2] > worst[0]:
                    worst = (cell[2], op, shard)
    if worst is not None:
        ms, op, shard = worst
        med = b.ps_ms.get(op, 0.0)
        if ms > max(5 * med, med + 20.0):
            out.append(Cause("ps_stall", min(ms - med, excess) if excess else ms - med,
                             f"PS shard {shard} answered a {op} in {ms:.1f} ms (that op's median "
                             f"{med:.1f} ms)"))
    misses = max(w.get("plan", {}).get("misses", 0) for w in win)
    if misses > max(2 * b.misses, b.misses + 64):
        extra = (misses - b.misses) * b.fill_per_miss
        out.append(Cause("miss_burst", extra, f"{misses} device misses planning a batch "
                                              f"(median {b.misses:.0f})"))
    shrinks = b._sum(i, "plan", "shrinks")
    if shrinks > b.shrinks:
        waited = max(0.0, st.get("read", 0.0) - b.stage["read"])
        out.append(Cause("lookahead_shrink", waited + (shrinks - b.shrinks) * 1e-3,
                         f"{shrinks:.0f} lookahead shrinks in the last {len(win)} batches' plans "
                         f"(median {b.shrinks:.0f}): the device tier could not hold the "
                         f"lookahead window, so planning waited for training"))
    stale = b._sum(i, "supply", "stale_drops")
    if stale > max(3 * b.stale, b.stale + 16):
        out.append(Cause("stale_drop_storm", (stale - b.stale) * b.fill_per_miss,
                         f"{stale:.0f} delivered rows dropped as stale around the step "
                         f"(median {b.stale:.0f}), fetched again"))
    faults = sum(w["os"]["major_faults"] for w in win)
    total = float(header.get("mem_total_mb", 0.0))
    low = total > 0 and r["os"]["mem_available_mb"] < 0.05 * total
    if low or faults > max(10 * max(b.faults, 1.0), 50):
        out.append(Cause("memory_pressure", excess,
                         f"{faults} major page faults around the step; "
                         f"{r['os']['mem_available_mb']:.0f} MiB available of {total:.0f}"))
    delay = r["os"]["run_delay_ms"]
    if delay - b.run_delay > max(10.0, 0.5 * excess) and delay > 0.2 * r["step_ms"]:
        out.append(Cause("cpu_contention", min(delay - b.run_delay, excess) if excess else
                         delay - b.run_delay,
                         f"the process's threads waited {delay:.1f} ms for a CPU (median "
                         f"{b.run_delay:.1f} ms): another process on the cores"))
    built = st.get("featurize", 0.0) - b.stage["featurize"]
    if built > 5.0 and st.get("read", 0.0) - b.stage["read"] > 0.5 * built:
        out.append(Cause("slow_data", built, f"the data worker built the batch in "
                                             f"{st['featurize']:.1f} ms (median "
                                             f"{b.stage['featurize']:.1f} ms) while the trainer "
                                             "waited"))
    return sorted(out, key=lambda c: -c.ms)


def explain(run: Path, threshold_ms: float | None = None, steps: tuple[int, int] | None = None,
            top: int = 20) -> Explanation:
    """The slow steps of ``run`` (at or above its p99, or above ``threshold_ms``: the ``top``
    slowest of them), or every step of ``steps`` (from, to), each with its grown stages and
    causes."""
    source = steps_file(Path(run))
    header, recs = read_steps(source)
    b = _Baseline(recs, int(header.get("lookahead", 0)))
    times = np.sort([r["step_ms"] for r in recs])
    p99 = float(times[min(len(times) - 1, int(0.99 * len(times)))])
    if steps is not None:
        rule = f"steps {steps[0]} to {steps[1]}"
        chosen = [r for r in recs if steps[0] <= r["step"] <= steps[1]]
    elif threshold_ms is not None:
        rule = f"above {threshold_ms:g} ms"
        chosen = [r for r in recs if r["step_ms"] > threshold_ms]
    else:
        rule = f"at or above the p99, {p99:.1f} ms"
        chosen = [r for r in recs if r["step_ms"] >= p99]
    if steps is None:  # (the steps asked for are all explained)
        chosen = sorted(chosen, key=lambda r: -r["step_ms"])[:top]
    slow = []
    for r in sorted(chosen, key=lambda r: r["step"]):
        grown = sorted(((k, float(r["stages"].get(k, 0.0)), b.stage[k]) for k in _STAGES
                        if r["stages"].get(k, 0.0) > b.stage[k] + 1.0),
                       key=lambda g: -(g[1] - g[2]))
        slow.append(SlowStep(r["step"], float(r["step_ms"]), b.step_ms, grown,
                             _causes(b, b.index[r["step"]], header)))
    return Explanation(source, len(recs), b.step_ms, p99, rule, slow)
