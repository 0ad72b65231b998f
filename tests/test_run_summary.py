"""The run summary (whole-run figures beside the last interval's), one evaluation per step,
undefined metrics as null, and where `cosparse train` writes its metrics file."""

import copy
import json
import math
from pathlib import Path

import pytest
import yaml

from cosparse.cli import main
from cosparse.config import config_from_mapping
from cosparse.train.trainer import Trainer

RUN = {
    "data": {"reader": "synthetic", "batch_size": 64, "workers": 1,
             "synthetic": {"num_features": 6, "vocab_size": 5000, "bag_min": 1, "bag_max": 3,
                           "seed": 5, "eval_batches": 2}},
    "model": {"kind": "dlrm", "bottom": [16, 8], "top": [16, 1]},
    "tables": [{"name": "a", "dim": 8, "features": [f"C{i}" for i in range(1, 7)]}],
    "train": {"steps": 20, "log_every": 5, "progress": False},
}


def _strict(text):
    """JSON with NaN and infinities refused (strict JSON has none)."""
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in strict JSON"))


def _records(path):
    return [_strict(x) for x in Path(path).read_text().splitlines()]


def _train(tmp_path, **train):
    raw = copy.deepcopy(RUN)
    raw["train"].update(metrics_json=str(tmp_path / "m.jsonl"), **train)
    t = Trainer(config_from_mapping(raw), log=lambda m: None)
    try:
        return t, t.run()
    finally:
        t.close()


def test_the_final_line_is_the_whole_run_and_the_last_interval_apart(tmp_path):
    t, final = _train(tmp_path, timing_warmup_steps=4)
    intervals = [r for r in _records(tmp_path / "m.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in intervals] == [5, 10, 15, 20]
    assert final["steps_trained"] == 20 and final["timed_steps"] == 16
    assert final["loss"] == pytest.approx(sum(t.losses) / 20)  # every step's, not the last five
    last = final["last_interval"]
    assert last["step"] == 20 and last["loss"] == pytest.approx(sum(t.losses[-5:]) / 5)
    # the whole run's link bytes are every interval's together; the last interval's its own
    assert final["bytes.worker_trainer"] == sum(r["bytes.worker_trainer"] for r in intervals)
    assert last["bytes.worker_trainer"] == intervals[-1]["bytes.worker_trainer"]
    assert final["bytes.worker_trainer"] > last["bytes.worker_trainer"] > 0
    assert 0 < final["step_ms_p50"] <= final["step_ms_p99"] and final["samples_per_s"] > 0
    assert final["stage_ms.forward"] > 0
    written = _records(tmp_path / "m.jsonl")[-1]
    assert written["kind"] == "final" and written["last_interval"]["step"] == 20


def test_a_run_no_longer_than_its_warm_up_times_every_step(tmp_path):
    _, final = _train(tmp_path, timing_warmup_steps=50)
    assert final["timed_steps"] == final["steps_trained"] == 20


def test_an_eval_interval_on_the_last_step_evaluates_once(tmp_path):
    _train(tmp_path, eval_every=10)
    evals = [r["step"] for r in _records(tmp_path / "m.jsonl") if r["kind"] == "eval"]
    assert evals == [10, 20]


def test_a_run_with_no_step_to_train_writes_its_undefined_loss_as_null(tmp_path):
    raw = copy.deepcopy(RUN)
    raw["train"].update(metrics_json=str(tmp_path / "m.jsonl"))
    t = Trainer(config_from_mapping(raw), log=lambda m: None)
    try:
        final = t.run(steps=0, evaluate=False)
    finally:
        t.close()
    assert math.isnan(final["loss"]) and final["steps_trained"] == 0
    assert final["last_interval"] is None
    written = _records(tmp_path / "m.jsonl")[-1]
    assert written["kind"] == "final" and written["loss"] is None


def _config(tmp_path, **train):
    raw = copy.deepcopy(RUN)
    raw["train"].update(steps=6, log_every=3, checkpoint={"dir": str(tmp_path / "ck"),
                                                          "every": 3}, **train)
    p = tmp_path / "small.yaml"
    p.write_text(yaml.safe_dump(raw))
    return str(p)


def test_a_run_without_a_metrics_path_gets_a_fresh_run_directory_and_resume_appends(
        tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    cfg = _config(tmp_path)
    assert main(["train", "--config", cfg, "--no-progress", "--steps", "3"]) == 0
    assert main(["train", "--config", cfg, "--no-progress", "--steps", "3"]) == 0
    runs = sorted((tmp_path / "runs").iterdir())  # (the second: a later time, or "-2")
    assert len(runs) == 2 and all("-small" in r.name for r in runs)
    for r in runs:
        assert [x["kind"] for x in _records(r / "metrics.jsonl")].count("final") == 1
    # the checkpoint (the second run's) names its run's file: a resume appends there
    capsys.readouterr()
    assert main(["train", "--config", cfg, "--no-progress", "--resume", str(tmp_path / "ck")]) == 0
    assert f"metrics: {runs[1] / 'metrics.jsonl'}" in capsys.readouterr().out
    after = _records(runs[1] / "metrics.jsonl")
    assert [r["kind"] for r in after].count("final") == 2 and after[-1]["step"] == 6
    assert len(list((tmp_path / "runs").iterdir())) == 2


def test_a_fresh_run_refuses_a_metrics_file_with_content_unless_appending(
        tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    m = tmp_path / "m.jsonl"
    cfg = _config(tmp_path, metrics_json=str(m))
    assert main(["train", "--config", cfg, "--no-progress"]) == 0
    before = m.read_text()
    capsys.readouterr()
    assert main(["train", "--config", cfg, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"train.metrics_json: {m} already holds" in err and "--append" in err
    assert m.read_text() == before  # nothing written
    assert main(["train", "--config", cfg, "--no-progress", "--append"]) == 0
    assert [r["kind"] for r in _records(m)].count("final") == 2
    assert not (tmp_path / "runs").exists()


def test_run_directories_started_in_the_same_second_are_two(tmp_path, monkeypatch):
    from cosparse.train import metrics_path

    monkeypatch.setattr(metrics_path.time, "strftime", lambda fmt: "20260101-000000")
    a = metrics_path.fresh_run_dir("x/small.yaml", tmp_path / "runs")
    b = metrics_path.fresh_run_dir("x/small.yaml", tmp_path / "runs")
    assert (a.name, b.name) == ("20260101-000000-small", "20260101-000000-small-2")
    assert a.is_dir() and b.is_dir()
