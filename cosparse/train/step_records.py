"""Per-step records: what each training step spent its time on, and what happened around it.

A step's record (one JSON line of ``steps.jsonl``, beside the run's metrics) holds:

- ``step_ms``: the step's wall time, from the end of the step before: the trainer's wait for
  its batch included;
- ``stages``: ``read`` (the trainer's wait for its next batch from the prefetch thread, which
  takes it from the data workers), ``featurize`` (the data worker building it), ``prep`` (ID
  work), ``plan`` and ``fill`` (the cache plan and the misses' rows brought in, on the prefetch
  thread), ``gather``, ``forward``, ``backward``, ``optim`` (dense and sparse), ``writeback``;
- ``plan``: what planning this batch did: unique IDs looked up, device misses, evictions,
  lookahead shrinks;
- ``moves``: the tiers' row moves since the previous step (bytes host->device, device->host,
  from the PS or the workers' deliveries to the device; rows evicted from the host), and
  ``supply``: the supply path's counters since the previous step (PS bytes, B's deliveries and
  stale drops);
- ``ps``: the PS requests this process answered during the step, ``{op: {shard: [count,
  total_ms, max_ms]}}``, as its clients saw them (the trainer's pushes; the prefetch thread's
  pulls and fills);
- ``os``: run delay, major faults, CPU time and available memory (``cosparse.train.os_probe``);
- ``fallback``: why the supply path fell back, on the first step after it did.

The counters that planning moves (``moves``, ``supply``) change on the prefetch thread, which
works up to ``supply.lookahead`` batches ahead: they belong to the steps just after. The file's
first line is a header naming that lookahead, so ``cosparse explain`` looks that far ahead.

With ``train.trace`` the recorder also keeps the spans of the chosen steps (``trace_file``).
Each interval it hands the trainer per-stage and per-(op, shard) PS latency samples, for p50/p99
scalars and histograms.
"""

from __future__ import annotations

import heapq
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from cosparse.config.train import TraceConfig
from cosparse.nn.types import PreparedBatch
from cosparse.spans import SPANS, Span
from cosparse.train.os_probe import OsProbe, mem_total_mb
from cosparse.train.trace_file import StepSpans, write_trace

STEPS_FILE = "steps.jsonl"
# the tier counters a step's record carries the change of (summed over the cached tables)
_MOVES = ("bytes_host_device", "bytes_device_host", "bytes_backing_device",
          "bytes_delivered_device", "evictions_host")
# the supply path's counters a step's record carries the change of, when the path has them
_SUPPLY = ("bytes.trainer_ps.pull", "bytes.trainer_ps.push", "bytes.worker_ps",
           "delivered_rows", "delivered_rows_used", "stale_drops", "filter_publishes")


def steps_path(metrics_json: str) -> Path:
    """Where the step records of a run writing metrics to ``metrics_json`` go: ``steps.jsonl``
    beside ``metrics.jsonl``, else ``<name>.steps.jsonl``."""
    p = Path(metrics_json)
    return p.with_name(STEPS_FILE if p.name == "metrics.jsonl" else f"{p.stem}.{STEPS_FILE}")


class StepRecorder:
    """Builds, writes and keeps (for the trace and the interval) every step's record."""

    def __init__(self, out: Path | None, trace: TraceConfig | None, header: dict[str, Any],
                 path_counters: Callable[[], dict[str, float]],
                 table_counters: Callable[[], dict[str, Any]]) -> None:
        """``out``: the steps file (None: records are built but not written); ``header``: what
        the first line says of the run (lookahead, placement); ``path_counters`` and
        ``table_counters``: the supply path's and the cached tables' cumulative counters."""
        self.trace = trace
        self._path_counters, self.table_counters = path_counters, table_counters
        self._file = None
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(out, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
            self._file.write(json.dumps({"kind": "header", "time": time.time(),
                                         "mem_total_mb": mem_total_mb(), **header}) + "\n")
        self._os = OsProbe()
        self._last_moves = self._moves_now()
        self._last_supply = self._supply_now()
        self._fallback: str | None = None
        self._kept: list[tuple[float, int, StepSpans]] = []  # the trace's steps (a heap)
        self._ps_samples: dict[str, list[float]] = {}  # "PULL.shard0" -> ms, this interval
        self.origin = time.perf_counter()
        SPANS.enable()

    def _moves_now(self) -> dict[str, int]:
        tables = [c.as_dict() for c in self.table_counters().values()]
        return {k: sum(t[k] for t in tables) for k in _MOVES}

    def _supply_now(self) -> dict[str, float]:
        now = self._path_counters()
        return {k: float(now[k]) for k in _SUPPLY if k in now}

    def fallback(self, reason: str) -> None:
        """The supply path fell back: the next step's record says why."""
        self._fallback = reason

    def step(self, step: int, wait: tuple[float, float], t_end: float, stages: dict[str, float],
             marks: dict[str, float], prepared: PreparedBatch, loss: float,
             prefetch_track: str) -> dict[str, Any]:
        """Record step ``step``: ``wait`` the trainer's wait for its batch (perf_counter start
        and end), ``t_end`` the step's end, ``marks`` the start of each of the trainer's own
        stages (``forward``, ``backward``, ``optim``, ``writeback``)."""
        spans = SPANS.take()
        moves, supply = self._moves_now(), self._supply_now()
        rec: dict[str, Any] = {
            "step": step, "time": time.time(),
            "step_ms": (t_end - wait[0]) * 1e3,
            "loss": loss if np.isfinite(loss) else None,
            "batch_size": prepared.batch.batch_size,
            "stages": {k: round(v, 4) for k, v in stages.items()},
            "plan": prepared.plan_stats or {},
            "moves": {k: v - self._last_moves[k] for k, v in moves.items()},
            "supply": {k: v - self._last_supply.get(k, 0.0) for k, v in supply.items()},
            "ps": self._ps(spans),
            "os": self._os.take(),
        }
        self._last_moves, self._last_supply = moves, supply
        if self._fallback is not None:
            rec["fallback"], self._fallback = self._fallback, None
        if self._file is not None:
            self._file.write(json.dumps(rec, allow_nan=False) + "\n")
        if self.trace is not None and self._wanted(step):
            self._keep(rec["step_ms"], step, StepSpans(
                step, wait, t_end, marks, stages, prepared.prep_at, prepared.plan_at,
                prepared.prep_ms, prepared.plan_ms, prepared.fill_ms, prefetch_track,
                prepared.batch.worker_spans, spans))
        return rec

    def _ps(self, spans: list[Span]) -> dict[str, dict[str, list[float]]]:
        """The step's PS requests by op and shard: [count, total ms, max ms]; each latency also
        joins the interval's samples."""
        out: dict[str, dict[str, list[float]]] = {}
        for s in spans:
            if s.shard < 0:
                continue
            ms = (s.t1 - s.t0) * 1e3
            cell = out.setdefault(s.op, {}).setdefault(str(s.shard), [0, 0.0, 0.0])
            cell[0] += 1
            cell[1] += ms
            cell[2] = max(cell[2], ms)
            self._ps_samples.setdefault(f"{s.op}.shard{s.shard}", []).append(ms)
        for by_shard in out.values():
            for cell in by_shard.values():
                cell[1], cell[2] = round(cell[1], 4), round(cell[2], 4)
        return out

    def _wanted(self, step: int) -> bool:
        tr = self.trace
        assert tr is not None
        if tr.steps is not None:
            return tr.steps[0] <= step <= tr.steps[1]
        return True  # (the slowest: the heap decides)

    def _keep(self, step_ms: float, step: int, spans: StepSpans) -> None:
        tr = self.trace
        assert tr is not None
        heapq.heappush(self._kept, (step_ms, step, spans))
        if tr.steps is None and len(self._kept) > (tr.slowest or 10):
            heapq.heappop(self._kept)  # the fastest kept step leaves

    def ps_latency_samples(self) -> dict[str, np.ndarray]:
        """The interval's PS request latencies (ms) per ``op.shardN``, and a new interval."""
        out = {k: np.asarray(v) for k, v in self._ps_samples.items()}
        self._ps_samples = {}
        return out

    def close(self) -> Path | None:
        """Close the steps file and write the trace, if one was asked for (its path)."""
        SPANS.enable(False)
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.trace is None:
            return None
        steps = sorted((s for _, _, s in self._kept), key=lambda s: s.step)
        path, self.trace, self._kept = Path(self.trace.path), None, []  # (written once)
        return write_trace(path, steps, self.origin)
