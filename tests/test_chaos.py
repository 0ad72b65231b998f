"""Chaos: an architecture-B run (2 embedded shards, 2 data workers) whose shards, data workers
and trainer are SIGKILLed at seeded random steps, restarted with ``--resume`` each time it
stops, ends with the same losses and rows as the run that was never interrupted (issue 11).

- a dead data worker: the run falls back to ps-direct (``supply.fallback``) and goes on;
- a dead shard: the run stops with exit code 4 (PS unavailable);
- a dead trainer: nothing is reported (SIGKILL); its shards and workers exit on their own.

The driver restarts after each stop with ``--resume``, which restarts the shards from their
snapshots. The kills survived and the recovery times are printed, and written as JSON to the
path in ``COSPARSE_CHAOS_JSON`` when it is set (the saved run: ``COSPARSE_CHAOS_JSON=
benchmarks/results/chaos.json``); a plain ``make test`` leaves the saved file alone.
This is one of the named long tests (bounded at 5 minutes).
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from proctree import cmdline, descendants, kill_all, parents, wait_gone

from cosparse.config import load_config
from cosparse.train.trainer import Trainer

pytestmark = pytest.mark.chaos  # the fault suite: pytest -m chaos

CLI = [sys.executable, "-m", "cosparse.cli", "train", "--no-progress"]
RESULTS = os.environ.get("COSPARSE_CHAOS_JSON")  # where to save the kills and recovery times
STEPS = 32


def _config(root: Path) -> str:
    cfg = {
        "data": {"reader": "synthetic", "batch_size": 256, "workers": 2,
                 "synthetic": {"num_features": 8, "num_dense": 4, "vocab_size": 20000,
                               "num_batches": STEPS, "eval_batches": 1, "seed": 3}},
        "model": {"kind": "dlrm", "bottom": [8, 8], "top": [8, 1]},
        "tables": [{"name": "t", "dim": 8, "features": [f"C{i}" for i in range(1, 9)],
                    "optimizer": {"kind": "adagrad", "lr": 0.05}}],
        "preset": "arch-b",
        "store": {"device": {"rows": 1500}, "host": {"rows": 3000},
                  "remote": {"embedded": True, "num_shards": 2, "data_dir": str(root / "ps"),
                             "heartbeat_s": 1.0, "timeout_s": 10.0}},
        "train": {"steps": STEPS, "log_every": 1, "progress": False, "threads": 1,
                  "metrics_json": str(root / "metrics.jsonl"), "stall_timeout_s": 60,
                  "checkpoint": {"dir": str(root / "ckpt"), "every": 4, "keep": 2}},
    }
    path = root / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _roles(trainer: int) -> dict[int, str]:
    """The trainer's live descendants: 'shard', 'worker' (a data worker: a child of the fork
    server) or 'other' (the fork server, the resource tracker)."""
    ppid = parents()
    out = {}
    for p in descendants(trainer):
        cmd = cmdline(p)
        out[p] = ("shard" if "ps serve" in cmd else
                  "worker" if "forkserver" in cmd and ppid.get(p) != trainer else "other")
    return out


def _losses(metrics: Path) -> list[tuple[int, float]]:
    """(step, loss) of every step logged, a step trained again after a restart each time. A line
    cut short by a SIGKILL (and the record appended to it) is skipped."""
    out = []
    for line in metrics.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("kind") == "train":
            out.append((rec["step"], rec["loss"]))
    return out


def _final_rows(config: str) -> tuple[dict, dict]:
    """Rows and dense weights of the last checkpoint, read back through a resumed trainer."""
    cfg = load_config(config)
    cfg.train.progress = False
    cfg.train.metrics_json = None
    t = Trainer(cfg, log=lambda m: None)
    try:
        t.resume(cfg.train.checkpoint.dir)
        assert t.state.step == STEPS
        rows = {}
        for name, st in t.ec.export_rows().items():
            order = np.argsort(st["ids"])
            rows[name] = (st["ids"][order], st["rows"][order])
        dense = {k: v.clone() for k, v in t.model.state_dict().items()}
    finally:
        t.close()
    return rows, dense


class Driver:
    """Runs ``cosparse train`` until it completes, killing as the schedule says."""

    def __init__(self, config: str, root: Path, kills: list[tuple[int, str]]) -> None:
        self.config, self.root, self.kills = config, root, list(kills)
        self.survived: list[dict] = []
        self.pending: dict | None = None  # a kill whose recovery is not yet seen

    def _command(self) -> list[str]:
        if (self.root / "ckpt" / "LATEST").exists():
            return [*CLI, "--config", self.config, "--resume", str(self.root / "ckpt")]
        # killed before the first checkpoint: the run starts again, its lines after the killed
        # start's in the one metrics file
        if (self.root / "ps").exists() and any((self.root / "ps").rglob("*")):
            return [*CLI, "--config", self.config, "--fresh", "--append"]
        return [*CLI, "--config", self.config, "--append"]

    def _kill(self, trainer: subprocess.Popen, step: int, target: str) -> None:
        roles = _roles(trainer.pid)
        victims = [trainer.pid] if target == "trainer" else sorted(
            p for p, role in roles.items() if role == target)
        assert victims, f"no {target} process under the trainer: {roles}"
        os.kill(victims[0], signal.SIGKILL)
        self.pending = {"target": target, "step": step, "at": time.monotonic(), "pid": trainer.pid,
                        "others": {p: st for p, st in descendants(trainer.pid).items()
                                   if p != victims[0]}}

    def run(self, deadline: float) -> None:
        while True:
            assert time.monotonic() < deadline, "the chaos run took too long"
            log = self.root / "stderr.log"  # a file: a full pipe would block the trainer
            with open(log, "w") as f:
                p = subprocess.Popen(self._command(), stdout=subprocess.PIPE, stderr=f, text=True)
            procs: dict[int, int] = {}
            try:
                for line in p.stdout:
                    if not line.startswith("step "):
                        continue
                    step = int(line.split()[1].rstrip(":"))
                    # recovered: the first step trained after the kill (after a shard or
                    # trainer kill, by the restarted run)
                    if self.pending is not None and (self.pending["target"] == "worker"
                                                     or self.pending["pid"] != p.pid):
                        self.pending["recovery_s"] = time.monotonic() - self.pending.pop("at")
                        self.pending.pop("pid")
                        self.survived.append(self.pending)
                        self.pending = None
                    procs.update(descendants(p.pid))
                    dying = (self.pending is not None and self.pending["pid"] == p.pid
                             and self.pending["target"] != "worker")
                    if self.kills and step >= self.kills[0][0] and not dying:
                        self._kill(p, step, self.kills.pop(0)[1])
                    if time.monotonic() > deadline:
                        break
                p.wait(timeout=60)
            finally:
                if p.poll() is None:
                    p.kill()
                    p.wait()
                if p.returncode != -signal.SIGKILL or not self.pending:
                    kill_all(procs)  # a failed test leaves nothing behind either
            if p.returncode == 0:
                return
            err = log.read_text()
            kind = self.pending["target"] if self.pending else None
            expected = {"trainer": -signal.SIGKILL, "shard": 4, "worker": 5}.get(kind)
            assert p.returncode == expected, (kind, p.returncode, err[-3000:])
            if kind == "trainer":  # nothing of the dead run may outlive it for long
                _, left = wait_gone(self.pending["others"], 5.0)
                kill_all(procs)
                assert not left, f"processes {left} outlived their SIGKILLed trainer by 5 s"
            else:
                assert "\nTraceback" not in err and err.strip().splitlines()[-1].startswith(
                    "cosparse: "), err[-3000:]


@pytest.mark.timeout(300)
def test_chaos_kills_then_resume_equal_the_uninterrupted_run(tmp_path):
    t0 = time.monotonic()
    ref_root, chaos_root = tmp_path / "ref", tmp_path / "chaos"
    ref_root.mkdir()
    chaos_root.mkdir()
    ref_cfg, chaos_cfg = _config(ref_root), _config(chaos_root)
    ref = subprocess.run([*CLI, "--config", ref_cfg], capture_output=True, text=True,
                         timeout=150)
    assert ref.returncode == 0, ref.stderr[-3000:]

    rng = random.Random(11)
    targets = ["worker", "shard", "trainer", "shard"]
    steps = sorted(rng.sample(range(3, STEPS - 3), len(targets)))
    driver = Driver(chaos_cfg, chaos_root, list(zip(steps, targets, strict=True)))
    driver.run(deadline=t0 + 270)
    assert not driver.kills and driver.pending is None, "a kill was not survived"

    ref_losses = dict(_losses(ref_root / "metrics.jsonl"))
    assert sorted(ref_losses) == list(range(1, STEPS + 1))
    got = _losses(chaos_root / "metrics.jsonl")
    assert {s for s, _ in got} == set(ref_losses), "a step's loss was never logged"
    for step, loss in got:  # every time a step was trained, before a kill or after
        assert loss == ref_losses[step], f"step {step}: loss {loss} != {ref_losses[step]}"
    ref_rows, ref_dense = _final_rows(ref_cfg)
    got_rows, got_dense = _final_rows(chaos_cfg)
    for name, (ids, rows) in ref_rows.items():
        assert np.array_equal(got_rows[name][0], ids)
        assert np.array_equal(got_rows[name][1], rows), f"table {name}: rows differ"
    for k, v in ref_dense.items():
        assert got_dense[k].equal(v), f"dense {k} differs"

    rec = [r["recovery_s"] for r in driver.survived]
    if RESULTS:
        Path(RESULTS).write_text(json.dumps({
            "kills_survived": len(driver.survived),
            "kills": [{"target": r["target"], "step": r["step"],
                       "recovery_s": round(r["recovery_s"], 2)} for r in driver.survived],
            "recovery_s": {"min": min(rec), "median": statistics.median(rec), "max": max(rec)},
            "steps": STEPS, "seed": 11, "wall_s": round(time.monotonic() - t0, 1),
        }, indent=2) + "\n")
    print(f"\nchaos: {len(rec)} kills survived, recovery min {min(rec):.1f} s, "
          f"median {statistics.median(rec):.1f} s, max {max(rec):.1f} s")
