"""Running one trial: the trial process started, its interval lines read as they come and
folded into measured windows (each reported to Optuna, which may prune the trial), and its end
awaited with a bound. A crash, an out-of-memory kill or an overrun is a measurement with an
error, never a silent skip.

A measured window is whole intervals that all start after the warm-up, ``window_steps`` steps
in all; its throughput is its samples over its time (the intervals' throughputs combined by
their steps, every batch of one size)."""

from __future__ import annotations

import json
import math
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cosparse.autotune.types import Measurement, task_metric
from cosparse.config import TrainConfig
from cosparse.lifeline import pdeathsig

# a window's figure is reported; the callback answers True to stop the trial (pruned)
Report = Callable[[int, float], bool]


class WindowFolder:
    """Interval records (the step each ends at, its samples/s) folded into measured windows.
    An interval that starts within the warm-up is not measured, whole or in part."""

    def __init__(self, warmup_steps: int, window_steps: int) -> None:
        self.warmup_steps, self.window_steps = warmup_steps, window_steps
        self.ended = 0  # the step the last interval ended at
        self.first = 0  # the current window's first step
        self.steps = 0  # steps in the current window so far
        self.seconds = 0.0  # their time, in seconds per sample

    def add(self, step: int, samples_per_s: float) -> tuple[int, int, float] | None:
        """A window completed by this interval: (its first step, its last, its samples/s)."""
        first, self.ended = self.ended + 1, step
        if first <= self.warmup_steps:
            return None
        if not self.steps:
            self.first = first
        n = step - first + 1
        self.steps += n
        self.seconds += n / samples_per_s if samples_per_s > 0 else math.inf
        if self.steps < self.window_steps:
            return None
        window = (self.first, step, self.steps / self.seconds if self.seconds > 0 else 0.0)
        self.steps, self.seconds = 0, 0.0
        return window


def _lines(stream: Any, out: queue.Queue) -> None:
    for line in stream:
        out.put(line)
    out.put(None)


def measure(raw: dict[str, Any], warmup_steps: int, workdir: Path, timeout_s: float,
            report: Report | None = None, evaluate: bool = False, world: int = 1,
            numbers: Path | None = None, window_steps: int | None = None) -> Measurement:
    """Train ``raw`` (its ``train.steps`` and ``log_every`` set by ``Window.config``) in a trial
    process, or on ``world`` ranks of one torchrun; the steps after ``warmup_steps``, in windows
    of ``window_steps`` (default: one interval each), are the measured windows. ``numbers``:
    where the trial writes its losses and whole rows."""
    workdir.mkdir(parents=True, exist_ok=True)
    cfg_path = workdir / "config.json"
    cfg_path.write_text(json.dumps(raw))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "cosparse.autotune.trial_run", str(cfg_path)]
    if world > 1:  # one torchrun of ``world`` ranks on this host (gloo: one thread each)
        env["OMP_NUM_THREADS"] = "1"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world),
               "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "-m",
               "cosparse.autotune.trial_run", str(cfg_path)]
    cmd += ["--evaluate"] if evaluate else []
    cmd += ["--numbers", str(numbers)] if numbers is not None else []
    proc = subprocess.Popen(cmd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True,  # (a pruned trial stops with its children)
                            preexec_fn=pdeathsig())  # (and with the agent, however it ends)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=_lines, args=(proc.stdout, lines), daemon=True)
    reader.start()
    err: list[str] = []
    err_reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    err_reader.start()
    m = Measurement()
    every = (raw.get("train") or {}).get("log_every") or TrainConfig.log_every
    folder = WindowFolder(warmup_steps, window_steps or int(every))
    try:
        while True:
            try:
                line = lines.get(timeout=timeout_s)
            except queue.Empty:
                m.error = f"the trial did not finish in {timeout_s:.0f} s (stopped)"
                return m
            if line is None:
                break
            if not line.startswith("{"):  # (a launcher's or a library's own line)
                continue
            rec = json.loads(line)
            if rec.get("done"):
                m.device_bytes, m.host_bytes = rec["device_bytes"], rec["host_bytes"]
                m.ps_bytes_per_step = rec["ps_bytes_per_step"]
                m.loss_digest, m.row_digest = rec["loss_digest"], rec["row_digest"]
                m.auc, m.logloss = rec.get("auc"), rec.get("logloss")
                m.aucs = rec.get("aucs") or task_metric(rec, "auc")
                m.loglosses = rec.get("loglosses") or task_metric(rec, "logloss")
            else:
                window = folder.add(int(rec["step"]), float(rec["samples_per_s"]))
                if window is None:
                    continue
                m.spans.append((window[0], window[1]))
                m.windows.append(window[2])
                if report is not None and report(len(m.windows) - 1, m.windows[-1]):
                    m.pruned = True
                    return m
        code = proc.wait(timeout=timeout_s)
        err_reader.join(timeout=5)
        if code != 0 or not m.loss_digest:
            tail = "".join(err)[-1500:].strip()
            why = "killed (out of memory?)" if code in (-9, 137) else f"exit {code}"
            m.error = f"the trial process failed ({why}): {tail}"
        return m
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait(timeout=30)
