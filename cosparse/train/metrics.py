"""Run metrics: per-interval aggregation, JSON lines and TensorBoard scalars."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


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
            self._json.write(json.dumps(record, sort_keys=True) + "\n")
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
        self.stage_ms: dict[str, float] = {}
        self.started = time.perf_counter()
        self.step_ms: list[float] = []

    def add_step(self, samples: int, loss: float, step_ms: float, stages: dict[str, float]) -> None:
        self.steps += 1
        self.samples += samples
        self.loss_sum += loss
        self.step_ms.append(step_ms)
        for k, v in stages.items():
            self.stage_ms[k] = self.stage_ms.get(k, 0.0) + v

    def summary(self) -> dict[str, float]:
        elapsed = time.perf_counter() - self.started
        n = max(self.steps, 1)
        out = {
            "loss": self.loss_sum / n,
            "samples_per_s": self.samples / elapsed if elapsed > 0 else 0.0,
        }
        if self.step_ms:
            s = sorted(self.step_ms)
            out["step_ms_p50"] = s[len(s) // 2]
            out["step_ms_p99"] = s[min(len(s) - 1, int(0.99 * len(s)))]
        for k, v in self.stage_ms.items():
            out[f"stage_ms.{k}"] = v / n
        return out
