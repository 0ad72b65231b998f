"""Running one trial: the trial process started, its interval lines read as they come (each
measured window reported to Optuna, which may prune the trial), and its end awaited with a
bound. A crash, an out-of-memory kill or an overrun is a measurement with an error, never a
silent skip."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cosparse.autotune.types import Measurement
from cosparse.lifeline import pdeathsig

# a window's figure is reported; the callback answers True to stop the trial (pruned)
Report = Callable[[int, float], bool]


def _lines(stream: Any, out: queue.Queue) -> None:
    for line in stream:
        out.put(line)
    out.put(None)


def measure(raw: dict[str, Any], warmup_steps: int, workdir: Path, timeout_s: float,
            report: Report | None = None, evaluate: bool = False, world: int = 1,
            numbers: Path | None = None) -> Measurement:
    """Train ``raw`` (its ``train.steps`` and ``log_every`` set to the window) in a trial
    process, or on ``world`` ranks of one torchrun; the intervals after ``warmup_steps`` are the
    measured windows. ``numbers``: where the trial writes its losses and whole rows."""
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
            elif rec["step"] > warmup_steps:
                m.windows.append(float(rec["samples_per_s"]))
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
