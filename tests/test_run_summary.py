"""The run summary (whole-run figures beside the last interval's), one evaluation per step,
undefined metrics as null."""

import copy
import json
import math
from pathlib import Path

import pytest

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
