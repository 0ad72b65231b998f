"""A checkpoint written before the public API, the run IDs and the stream offsets (cosparse at
commit 7380004, main at the start of 2026-12-07's second session) still resumes: the resumed
run trains the steps after it with the very losses the old code trained (issue 34, item 5).
The checkpoint is 40 KB of a tiny synthetic run, kept in ``tests/data/checkpoint_7380004``
with its config and the old run's losses (``run.json``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from cosparse.cli import main

OLD = Path(__file__).resolve().parent / "data" / "checkpoint_7380004"


def test_a_checkpoint_of_the_old_layout_resumes_with_the_old_runs_losses(tmp_path):
    run = json.loads((OLD / "run.json").read_text())
    ckpt = tmp_path / "ckpt"
    shutil.copytree(OLD / "step_00000003", ckpt / "step_00000003")
    (ckpt / "LATEST").write_text("step_00000003")
    cfg = run["config"]
    cfg["train"]["checkpoint"]["dir"] = str(ckpt)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    metrics = tmp_path / "m.jsonl"
    assert main(["train", "--config", str(path), "--resume", str(ckpt), "--metrics-json",
                 str(metrics), "--no-progress"]) == 0
    losses = [r["loss"] for r in map(json.loads, metrics.read_text().splitlines())
              if r["kind"] == "train"]
    assert losses == run["losses"][3:]  # steps 4..6, bit for bit
