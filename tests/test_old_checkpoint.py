"""A checkpoint written before the public API, the run IDs and the stream offsets (cosparse at
commit 7380004, main at the start of 2026-12-07's second session) still resumes: the resumed
run trains the steps after it with the very losses the old code trained (issue 34, item 5).
Two layouts of a tiny synthetic run, each with its config and the old run's losses
(``run.json``): all rows in the checkpoint (``tests/data/checkpoint_7380004``, 40 KB), and
ps-direct over 2 embedded shards, the rows in the shards' snapshots
(``tests/data/checkpoint_7380004_ps``, 100 KB)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from cosparse.cli import main

DATA = Path(__file__).resolve().parent / "data"


@pytest.mark.parametrize("layout", ["checkpoint_7380004", "checkpoint_7380004_ps"])
def test_a_checkpoint_of_the_old_layout_resumes_with_the_old_runs_losses(tmp_path, layout):
    old = DATA / layout
    run = json.loads((old / "run.json").read_text())
    ckpt = tmp_path / "ckpt"
    shutil.copytree(old / "step_00000003", ckpt / "step_00000003")
    (ckpt / "LATEST").write_text("step_00000003")
    cfg = run["config"]
    cfg["train"]["checkpoint"]["dir"] = str(ckpt)
    if (old / "ps").is_dir():  # the shards restore the snapshot the checkpoint names
        shutil.copytree(old / "ps", tmp_path / "ps")
        cfg["store"]["remote"]["data_dir"] = str(tmp_path / "ps")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    metrics = tmp_path / "m.jsonl"
    assert main(["train", "--config", str(path), "--resume", str(ckpt), "--metrics-json",
                 str(metrics), "--no-progress"]) == 0
    losses = [r["loss"] for r in map(json.loads, metrics.read_text().splitlines())
              if r["kind"] == "train"]
    assert losses == run["losses"][3:]  # steps 4..6, bit for bit
