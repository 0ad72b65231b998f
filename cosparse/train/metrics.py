"""Run metrics: per-interval aggregation, JSON lines and TensorBoard scalars.

An undefined metric (the AUC of a one-class eval split, the loss of an interval whose every
batch was skipped) is NaN in memory and ``null`` in every JSON file or line written: JSON has no
NaN. ``json_safe`` does that, and ``dumps_metrics`` dumps with ``allow_nan=False`` so that a
non-finite value that escaped it fails loudly instead of writing invalid JSON.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any


def json_safe(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float (in dicts, lists and tuples) replaced by None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    if hasattr(obj, "item") and getattr(obj, "ndim", None) == 0:  # numpy / torch scalars
        return json_safe(obj.item())
    return obj


def dumps_metrics(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of metrics with undefined values as ``null`` (strict JSON)."""
    return json.dumps(json_safe(obj), allow_nan=False, **kwargs)


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

    def summary(self) -> dict[str, float]:
        elapsed = time.perf_counter() - self.started
        n = max(self.steps, 1)
        out = {
            # NaN (written as null) when every step of the interval was skipped
            "loss": self.loss_sum / self.loss_steps if self.loss_steps else
            (math.nan if self.steps else 0.0),
            "samples_per_s": self.samples / elapsed if elapsed > 0 else 0.0,
        }
        if self.step_ms:
            s = sorted(self.step_ms)
            out["step_ms_p50"] = s[len(s) // 2]
            out["step_ms_p99"] = s[min(len(s) - 1, int(0.99 * len(s)))]
        for k, v in self.stage_ms.items():
            out[f"stage_ms.{k}"] = v / n
        return out
