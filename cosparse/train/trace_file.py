"""Chrome/Perfetto trace files (the JSON trace-event format: ``{"traceEvents": [...]}``).

One track per thread and process: the trainer thread (its wait for the batch, forward,
backward, optim, writeback), the prefetch/planner thread (ID work, plan, fill), each data worker
process (building the batch; architecture B: dedup, filter and cold-row pulls too), the filter
publisher, and one track per PS shard carrying the requests the trainer process sent it, from
send to answer (the round trip a client sees: a stalled shard shows as a long span there).

Complete events (``ph: X``) carry ``ts`` and ``dur`` in microseconds since the run's start;
metadata events (``ph: M``) name processes and threads. Times come from ``perf_counter``, the
host's monotonic clock, so spans of different processes line up.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosparse.spans import Span

PS_PID_BASE = 1 << 30  # a PS shard's track is a process of its own: this id plus its index
_TRAINER = "trainer"


@dataclass
class StepSpans:
    """What one step's trace holds: its timestamps, stage times and the spans around it."""

    step: int
    wait: tuple[float, float]  # the trainer's wait for the batch
    end: float
    marks: dict[str, float]  # start of forward, backward, optim, writeback
    stages: dict[str, float]
    prep_at: float
    plan_at: float
    prep_ms: float
    plan_ms: float
    fill_ms: float
    prefetch_track: str
    worker_spans: list | None  # [pid, [[name, t0, t1], ...]]
    spans: list[Span]  # PS requests and helper threads' work during the step


class _Events:
    """Trace events with their process and thread ids, and the names they need."""

    def __init__(self, origin: float) -> None:
        self.origin = origin
        self.events: list[dict[str, Any]] = []
        self.processes: dict[int, str] = {}
        self.threads: dict[tuple[int, str], int] = {}

    def span(self, name: str, pid: int, process: str, track: str, t0: float, t1: float,
             args: dict[str, Any]) -> None:
        if t1 < t0 or t0 <= 0:
            return
        self.processes.setdefault(pid, process)
        tid = self.threads.setdefault((pid, track), len(self.threads) + 1)
        self.events.append({"name": name, "cat": track, "ph": "X", "pid": pid, "tid": tid,
                            "ts": round((t0 - self.origin) * 1e6, 3),
                            "dur": round((t1 - t0) * 1e6, 3), "args": args})

    def metadata(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for pid, name in self.processes.items():
            out.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                        "args": {"name": name}})
        for (pid, track), tid in self.threads.items():
            out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                        "args": {"name": track}})
        return out


def _step_events(ev: _Events, s: StepSpans, pid: int) -> None:
    args = {"step": s.step}
    ev.span("wait for batch", pid, _TRAINER, _TRAINER, s.wait[0], s.wait[1], args)
    order = [k for k in ("forward", "backward", "optim", "writeback") if k in s.marks]
    for k, nxt in zip(order, [*order[1:], None], strict=True):
        t1 = s.marks[nxt] if nxt is not None else s.end
        ev.span(k, pid, _TRAINER, _TRAINER, s.marks[k], t1,
                {**args, **({"gather_ms": s.stages.get("gather", 0.0)} if k == "forward" else {})})
    ev.span("prep (ID work)", pid, _TRAINER, s.prefetch_track, s.prep_at,
            s.prep_at + s.prep_ms / 1e3, args)
    ev.span("plan", pid, _TRAINER, s.prefetch_track, s.plan_at,
            s.plan_at + (s.plan_ms - s.fill_ms) / 1e3, args)
    ev.span("fill", pid, _TRAINER, s.prefetch_track, s.plan_at + (s.plan_ms - s.fill_ms) / 1e3,
            s.plan_at + s.plan_ms / 1e3, args)
    if s.worker_spans:
        wpid, parts = s.worker_spans
        for name, t0, t1 in parts:
            ev.span(name, int(wpid), f"data worker {wpid}", "worker", t0, t1, args)
    for sp in s.spans:
        if sp.shard >= 0:
            ev.span(sp.op, PS_PID_BASE + sp.shard, f"ps shard {sp.shard} (as the trainer saw it)",
                    "requests", sp.t0, sp.t1, args)
        else:
            ev.span(sp.name, sp.pid or pid, _TRAINER, sp.track, sp.t0, sp.t1, args)


def write_trace(path: Path, steps: list[StepSpans], origin: float) -> Path:
    """Write the trace of ``steps`` (atomically) and return its path."""
    ev = _Events(origin)
    pid = os.getpid()
    for s in steps:
        _step_events(ev, s, pid)
    doc = {"traceEvents": ev.metadata() + ev.events, "displayTimeUnit": "ms",
           "otherData": {"steps": [s.step for s in steps], "producer": "cosparse"}}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)
    return path
