"""Chaos, wrong rows (issue 32, items 1 and 2): a run never trains on another run's PS rows.

- External shards (real ``cosparse ps serve`` processes) restore their newest snapshot when
  they start: a fresh run against shards that hold rows of its namespace is refused (exit 2)
  naming the shards and the flags; ``--fresh`` drops its own namespace's tables there (a CLEAR
  request) and leaves another namespace's rows alone.
- Resuming run X's checkpoint with run Y's ``store.remote.data_dir`` (whose snapshots are named
  alike) is refused (exit 7, a checkpoint error) naming both run IDs and both paths; resuming
  with X's own goes on, under X's run ID.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from cosparse import exits
from cosparse.cli import main
from cosparse.config import OptimizerConfig, TableConfig
from cosparse.ps import PSClient
from cosparse.train.checkpoint import read_meta

pytestmark = pytest.mark.chaos  # the fault suite: pytest -m chaos

OTHER = TableConfig("other", dim=4, optimizer=OptimizerConfig(kind="sgd", lr=0.1), seed=2)


def _config(root: Path, remote: dict, ck: Path, name: str = "c") -> str:
    raw = {
        "preset": "arch-a",
        "data": {"reader": "synthetic", "batch_size": 64,
                 "synthetic": {"num_features": 4, "num_dense": 2, "vocab_size": 2000,
                               "num_batches": 1000, "eval_batches": 1}},
        "model": {"kind": "dlrm", "bottom": [8, 4], "top": [8, 1]},
        "tables": [{"name": "cat", "dim": 4, "features": ["C1", "C2", "C3", "C4"]}],
        "store": {"remote": {"num_shards": 1, "timeout_s": 10.0, **remote}},
        "train": {"steps": 2, "log_every": 2, "progress": False, "threads": 1,
                  "checkpoint": {"dir": str(ck), "every": 2}},
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _start_shards(root: Path) -> tuple[list[subprocess.Popen], list[str]]:
    """An external shard (``cosparse ps serve``) with its data under ``root``."""
    procs, readies = [], []
    for i in range(1):
        ready = root / f"ready-{i}"
        ready.unlink(missing_ok=True)
        readies.append(ready)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "cosparse.cli", "ps", "serve", "--shard", str(i),
             "--num-shards", "1", "--data-dir", str(root / f"shard-{i}"), "--ready-file",
             str(ready), "--parent-pid", str(os.getpid())],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    deadline = time.monotonic() + 60
    while not all(r.exists() for r in readies) and time.monotonic() < deadline \
            and all(p.poll() is None for p in procs):
        time.sleep(0.05)
    assert all(r.exists() for r in readies), [p.poll() for p in procs]
    return procs, [r.read_text().strip() for r in readies]


def _final(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])["final"]


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait(10)


def test_a_fresh_run_on_external_shards_holding_its_rows_is_refused_and_fresh_clears_them(
        tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ps, ck = tmp_path / "ps", tmp_path / "ck"
    procs, endpoints = _start_shards(ps)
    try:
        cfg = _config(tmp_path, {"embedded": False, "endpoints": endpoints, "namespace": "a"}, ck)
        ids = np.arange(300, dtype=np.int64)
        with PSClient(endpoints, timeout_s=10, namespace="b") as b:  # another tenant's rows
            b.register([OTHER])
            b.push("other", ids, np.ones((300, 4), np.float32), step=1)
            b_rows = b.pull("other", ids).rows
        assert main(["train", "--config", cfg]) == 0  # run 1: a snapshot at step 2
        loss1 = _final(capsys.readouterr().out)["loss"]
        _stop(procs)  # the shards restart: they restore their newest snapshot, run 1's rows
        procs, endpoints2 = _start_shards(ps)
        cfg = _config(tmp_path, {"embedded": False, "endpoints": endpoints2, "namespace": "a"}, ck)
        capsys.readouterr()

        assert main(["train", "--config", cfg]) == exits.USAGE
        err = capsys.readouterr().err
        run1 = read_meta(ck)["ps"]["run_id"]
        assert "hold rows of namespace 'a'" in err and f"of run {run1}" in err, err
        assert endpoints2[0] in err and f"--resume {ck}" in err and "--fresh" in err, err

        assert main(["train", "--config", cfg, "--fresh"]) == 0
        out = capsys.readouterr()
        assert "--fresh: dropped" in out.out + out.err and "namespace 'a'" in out.out + out.err
        assert _final(out.out)["loss"] == loss1  # trained from clean rows, as run 1 did
        with PSClient(endpoints2, timeout_s=10, namespace="b") as b:  # untouched by the clear
            got = b.pull("other", ids)
            np.testing.assert_array_equal(got.rows, b_rows)
            assert (got.versions == 1).all()
            runs = {s["run_ids"].get("a") for s in b.stats()}
        run2 = read_meta(ck)["ps"]["run_id"]
        assert run2 != run1 and runs == {run2}  # the fresh run's own ID, on every shard
    finally:
        _stop(procs)


def test_resume_with_another_runs_data_dir_is_refused_naming_both_runs_and_paths(
        tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ck_x, ck_y, ps_x, ps_y = (tmp_path / n for n in ("ck-x", "ck-y", "ps-x", "ps-y"))
    cfg_x = _config(tmp_path, {"data_dir": str(ps_x)}, ck_x, "x")
    assert main(["train", "--config", cfg_x]) == 0
    assert main(["train", "--config", _config(tmp_path, {"data_dir": str(ps_y)}, ck_y, "y")]) == 0
    assert read_meta(ck_x)["ps"]["snapshots"] == read_meta(ck_y)["ps"]["snapshots"]  # alike
    capsys.readouterr()

    mixed = _config(tmp_path, {"data_dir": str(ps_y)}, ck_x, "mixed")  # X's checkpoints, Y's PS data
    assert main(["train", "--config", mixed, "--resume", str(ck_x), "--steps", "4"]) \
        == exits.CHECKPOINT
    err = capsys.readouterr().err
    run_x, run_y = (read_meta(c)["ps"]["run_id"] for c in (ck_x, ck_y))
    assert run_x != run_y
    manifest = json.loads((ps_y / "shard-0" / "snapshots" / read_meta(ck_y)["ps"]["snapshots"][0]
                           / "manifest.json").read_text())
    assert manifest["run_ids"] == {"default": run_y}
    assert "cosparse: checkpoint error:" in err and run_x in err and run_y in err, err
    assert str(ck_x / "step_00000002") in err and str(ps_y / "shard-0") in err, err

    assert main(["train", "--config", cfg_x, "--resume", str(ck_x), "--steps", "4"]) == 0
    meta = read_meta(ck_x)
    assert meta["step"] == 4 and meta["ps"]["run_id"] == run_x  # kept across the resume
