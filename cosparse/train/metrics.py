"""Run metrics: per-interval aggregation (step figures, and the deltas of the store's and the
supply path's cumulative counters), JSON lines and TensorBoard scalars.

An undefined metric (the AUC of a one-class eval split, the loss of an interval whose every
batch was skipped) is NaN in memory and ``null`` in every JSON line written
(``cosparse.strict_json``).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from cosparse.store.types import TableCounters
from cosparse.strict_json import dumps_metrics


class MetricsSink:
    """Writes metric records as JSON lines and TensorBoard scalars (either may be off)."""

    def __init__(self, json_path: str | None, tensorboard_dir: str | None) -> None:
        self._json = None
        if json_path:
            Path(json_path).parent.mkdir(parents=True, exist_ok=True)
            self._json = open(json_path, "a", encoding="utf-8")  # noqa: SIM115
        self._tb = None
        if tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=tensorboard_dir)

    def write(self, record: dict[str, Any]) -> None:
        record = {"time": time.time(), **record}
        if self._json is not None:
            self._json.write(dumps_metrics(record, sort_keys=True) + "\n")
            self._json.flush()
        if self._tb is not None:
            step = int(record.get("step", 0))
            for k, v in record.items():
                if k not in ("step", "time", "kind") and isinstance(v, (int, float)):
                    self._tb.add_scalar(f"{record.get('kind', 'train')}/{k}", v, step)
            self._tb.flush()

    def histograms(self, kind: str, step: int, samples: dict[str, np.ndarray]) -> None:
        """TensorBoard histograms of an interval's samples (stage times, PS latencies)."""
        if self._tb is None:
            return
        for name, values in samples.items():
            if len(values):
                self._tb.add_histogram(f"{kind}/{name}", np.asarray(values), step)
        self._tb.flush()

    def close(self) -> None:
        if self._json is not None:
            self._json.close()
            self._json = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


class IntervalStats:
    """Accumulates per-step figures between two log points."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.steps = 0
        self.samples = 0
        self.loss_sum = 0.0
        self.loss_steps = 0  # steps whose loss counts (not skipped)
        self.skipped = 0
        self.stage_ms: dict[str, float] = {}
        self.stage_steps: dict[str, list[float]] = {}  # each step's time in each stage
        self.started = time.perf_counter()
        self.step_ms: list[float] = []

    def add_step(self, samples: int, loss: float, step_ms: float, stages: dict[str, float],
                 skipped: bool = False) -> None:
        """One step; a ``skipped`` one (no update, a non-finite loss) is not in the mean loss."""
        self.steps += 1
        self.samples += samples
        if skipped:
            self.skipped += 1
        else:
            self.loss_sum += loss
            self.loss_steps += 1
        self.step_ms.append(step_ms)
        for k, v in stages.items():
            self.stage_ms[k] = self.stage_ms.get(k, 0.0) + v
            self.stage_steps.setdefault(k, []).append(v)

    def stage_samples(self) -> dict[str, np.ndarray]:
        """Each stage's time (ms) in every step of the interval."""
        return {k: np.asarray(v) for k, v in self.stage_steps.items()}

    def summary(self) -> dict[str, float]:
        elapsed = time.perf_counter() - self.started
        n = max(self.steps, 1)
        out = {
            # NaN (written as null) when no step's loss counts: all skipped, or none trained
            "loss": self.loss_sum / self.loss_steps if self.loss_steps else math.nan,
            "samples_per_s": self.samples / elapsed if elapsed > 0 else 0.0,
        }
        if self.step_ms:
            out["step_ms_p50"], out["step_ms_p99"] = percentiles(self.step_ms)
        for k, v in self.stage_ms.items():
            out[f"stage_ms.{k}"] = v / n
            out[f"stage_ms_p50.{k}"], out[f"stage_ms_p99.{k}"] = percentiles(self.stage_steps[k])
        return out


def percentiles(values: list[float] | np.ndarray) -> tuple[float, float]:
    """The p50 and p99 of ``values`` (nearest rank, as the step-time figures always were)."""
    s = np.sort(np.asarray(values, dtype=np.float64))
    return float(s[len(s) // 2]), float(s[min(len(s) - 1, int(0.99 * len(s)))])


# the PS latency histograms' bucket edges (ms): log-spaced, 10 us to 100 s
LATENCY_EDGES_MS = np.logspace(-2, 5, 29)


def latency_figures(samples: dict[str, np.ndarray]) -> dict[str, Any]:
    """An interval's PS request latencies (``ps_ms.<op>.shard<i>`` -> ms each): p50, p99 and
    count scalars per op and shard, and their histograms (``ps_latency_ms``: counts per
    ``LATENCY_EDGES_MS`` bucket, the first and last open-ended)."""
    out: dict[str, Any] = {}
    hist: dict[str, dict[str, Any]] = {}
    for key, v in sorted(samples.items()):
        if not len(v):
            continue
        out[f"{key}.p50"], out[f"{key}.p99"] = percentiles(v)
        out[f"{key}.count"] = int(len(v))
        counts = np.bincount(np.searchsorted(LATENCY_EDGES_MS, v), minlength=len(LATENCY_EDGES_MS) + 1)
        hist[key.removeprefix("ps_ms.")] = {"counts": counts.tolist()}
    if hist:
        out["ps_latency_ms"] = {"edges": [round(float(e), 6) for e in LATENCY_EDGES_MS],
                                **hist}
    return out


class CounterDeltas:
    """Cumulative counters in, their change since the last call out."""

    def __init__(self) -> None:
        self._prev: dict[str, float] = {}

    def reset(self, now: dict[str, float]) -> None:
        self._prev = dict(now)

    def take(self, now: dict[str, float]) -> dict[str, float]:
        out = {k: v - self._prev.get(k, 0) for k, v in now.items()}
        self._prev = dict(now)
        return out


def tier_metrics(delta: dict[str, dict[str, int]], below: str) -> dict[str, float]:
    """An interval's tier figures from each cached table's counter deltas: hit rates per tier,
    bytes per link, evictions, and where the device misses came from (``below``: what lies
    under the host tier, ``trainer_ps`` or ``backing``)."""
    out: dict[str, float] = {}
    totals = {k: sum(d[k] for d in delta.values()) for k in TableCounters().as_dict()}
    for name, d in delta.items():
        if d["lookups"]:
            out[f"hit_rate.device.{name}"] = d["device_hits"] / d["lookups"]
            out[f"hit_rate.host.{name}"] = d["host_hits"] / d["lookups"]
        out[f"bytes.host_device.{name}"] = d["bytes_host_device"]
        out[f"bytes.device_host.{name}"] = d["bytes_device_host"]
        out[f"evictions.device.{name}"] = d["evictions_device"]
        out[f"evictions.host.{name}"] = d["evictions_host"]
    if totals["lookups"]:
        out["hit_rate.device"] = totals["device_hits"] / totals["lookups"]
        out["hit_rate.host"] = totals["host_hits"] / totals["lookups"]
    for key in ("host_device", "device_host", "delivered_device", "backing_device",
                "host_backing"):
        out[f"bytes.{key}"] = totals[f"bytes_{key}"]
    out["evictions.device"] = totals["evictions_device"]
    out["evictions.host"] = totals["evictions_host"]
    misses = totals["lookups"] - totals["device_hits"]
    for share, key in (("host", "host_hits"), ("delivered", "delivered_hits"),
                       (below, "backing_hits"), ("fresh", "fresh_rows")):
        out[f"miss_share.{share}"] = totals[key] / misses if misses else 0.0
    out["ttl_drops"] = totals["ttl_drops"]
    return out


class IntervalCounters:
    """The interval's link, supply and tier figures: the deltas of the supply path's and the
    cached tables' cumulative counters since the last log point (or the run's start), plus the
    path's gauges, admission and planner figures."""

    def __init__(self, ec: Any, path: Any, wire_bytes: int) -> None:
        self.ec, self.path = ec, path
        self._path = CounterDeltas()
        self._path.reset(self._path_counters(wire_bytes))
        self._tables: dict[str, CounterDeltas] = {}
        for name, c in ec.counters().items():
            self._tables[name] = CounterDeltas()
            self._tables[name].reset(c.as_dict())
        self._shrinks = ec.planner.shrinks

    def _path_counters(self, wire_bytes: int) -> dict[str, float]:
        return {**self.path.counters(), "bytes.worker_trainer": wire_bytes}

    def take(self, wire_bytes: int) -> dict[str, float]:
        ec = self.ec
        out = self._path.take(self._path_counters(wire_bytes))
        out.update(self.path.gauges())
        if ec.admission:
            out["admission.rejected"] = sum(a.rejected for a in ec.admission.values())
        tables = ec.counters()
        if not tables:
            return out
        delta = {n: self._tables.setdefault(n, CounterDeltas()).take(c.as_dict())
                 for n, c in tables.items()}
        out.update(tier_metrics(delta, self.path.below))  # type: ignore[arg-type]
        out["lookahead_shrinks"] = ec.planner.shrinks - self._shrinks
        out["hbm_share"] = ec.hbm_share() or 0.0
        self._shrinks = ec.planner.shrinks
        return out
