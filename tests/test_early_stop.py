"""Early stopping (train.early_stop) and keep_best: a run that starts to overfit stops, ends on
its best evaluation's checkpoint and says so; the rules of the keys."""

import copy
import json
import math

import pytest

from cosparse.config import ConfigError, EarlyStopConfig, config_from_mapping
from cosparse.train.checkpoint import read_meta
from cosparse.train.early_stop import EarlyStopper
from cosparse.train.trainer import Trainer

# a tiny synthetic training set (8 batches) seen over and over: the eval AUC climbs for a few
# evaluations, then falls as the model memorises the training batches
OVERFITS = {
    "data": {"reader": "synthetic", "batch_size": 64, "workers": 0,
             "synthetic": {"num_features": 6, "vocab_size": 20000, "bag_min": 1, "bag_max": 2,
                           "seed": 5, "num_batches": 8, "eval_batches": 4}},
    "model": {"kind": "dlrm", "bottom": [16, 8], "top": [32, 1],
              "dense_optimizer": {"kind": "adagrad", "lr": 0.02}},
    "tables": [{"name": "a", "dim": 8, "features": [f"C{i}" for i in range(1, 7)],
                "optimizer": {"kind": "adagrad", "lr": 0.1}}],
    "train": {"steps": 120, "epochs": 100, "progress": False, "log_every": 1000},
}


def _raw(tmp_path, **train):
    raw = copy.deepcopy(OVERFITS)
    raw["train"].update(metrics_json=str(tmp_path / "m.jsonl"),
                        checkpoint={"dir": str(tmp_path / "ck")}, **train)
    return raw


@pytest.mark.parametrize("preset, metric", [("resident", "auc"), ("resident", "logloss"),
                                            ("arch-a", "auc"), ("arch-b", "auc")])
def test_an_overfitting_run_stops_and_ends_on_its_best_checkpoint(tmp_path, preset, metric):
    raw = _raw(tmp_path, early_stop={"metric": metric, "patience": 3, "every": 4},
               keep_best=True)
    raw["preset"] = preset
    if preset != "resident":  # the PS snapshots its rows; checkpoints name the snapshots
        raw["store"] = {"remote": {"num_shards": 1, "data_dir": str(tmp_path / "ps")}}
    if preset == "arch-b":  # tiers over the PS, the workers deliver the cold rows
        raw["store"].update(device={"rows": 1024}, host={"rows": 4096})
        raw["data"]["workers"] = 1
    logs: list[str] = []
    t = Trainer(config_from_mapping(raw), log=logs.append)
    try:
        final = t.run()
    finally:
        t.close()
    records = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    evals = {r["step"]: r[metric] for r in records if r["kind"] == "eval"}
    pick = max if metric == "auc" else min
    best_step = pick(evals, key=lambda s: evals[s])
    stopped = final["early_stopped_at"]
    assert stopped is not None and stopped < 120, "the run should have stopped early"
    assert stopped == max(evals) and best_step < stopped
    # patience: the evaluations after the best, up to the stop, are exactly `patience`
    assert len([s for s in evals if s > best_step]) == 3
    assert final["best_step"] == best_step and final["best_metric"] == evals[best_step]
    assert final["best_restored"] and final["step"] == best_step
    assert final[metric] == evals[best_step]  # the final line describes the best state
    # the run's final checkpoint (LATEST) is the best state: its own evaluation agrees
    assert read_meta(tmp_path / "ck")["step"] == best_step
    assert final["best_checkpoint"].endswith(f"step_{best_step:08d}")
    again = copy.deepcopy(raw)
    again["train"].pop("early_stop")
    again["train"].update(keep_best=False, metrics_json=None)
    if preset != "resident":
        again["store"]["remote"]["data_dir"] = str(tmp_path / "ps")
    check = Trainer(config_from_mapping(again), log=lambda m: None)
    try:
        check.resume(str(tmp_path / "ck"))
        assert check.state.step == best_step
        assert check.evaluate()[metric] == final["best_metric"]
    finally:
        check.close()
    said = "\n".join(logs)
    assert f"early stopping at step {stopped}" in said
    assert f"the run ends on its best evaluation (step {best_step})" in said
    last = records[-1]
    assert last["kind"] == "final" and last["best_step"] == best_step


def test_early_stopping_without_keep_best_stops_without_restoring(tmp_path):
    raw = _raw(tmp_path, early_stop={"metric": "auc", "patience": 2, "every": 4}, eval_every=4)
    t = Trainer(config_from_mapping(raw), log=lambda m: None)
    try:
        final = t.run()
    finally:
        t.close()
    stopped = final["early_stopped_at"]
    assert stopped is not None and final["step"] == stopped and "best_checkpoint" not in final
    records = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    eval_steps = [r["step"] for r in records if r["kind"] == "eval"]
    # eval_every and early_stop.every land on the same steps, and the end-of-run evaluation on
    # the last one: each step is evaluated once
    assert eval_steps == list(range(4, stopped + 1, 4))
    assert not (tmp_path / "ck").exists()


def test_the_stopper_counts_patience_and_never_improves_on_nan():
    s = EarlyStopper(EarlyStopConfig(metric="logloss", patience=2, every=1))
    assert s.observe(1, {"logloss": 0.7}).improved
    assert not s.observe(2, {"logloss": math.nan}).stop  # undefined: no better, no worse
    v = s.observe(3, {"logloss": 0.69})
    assert v.improved and not v.stop and s.best_step == 3
    assert not s.observe(4, {"logloss": 0.71}).stop
    assert s.observe(5, {"logloss": 0.70}).stop and s.stopped_at == 5
    assert s.figures() == {"early_stopped_at": 5, "best_step": 3, "best_metric": 0.69,
                           "best_metric_name": "logloss"}
    a = EarlyStopper(EarlyStopConfig(metric="auc", patience=1, every=1))
    assert a.observe(1, {"auc": 0.6}).improved and not a.observe(2, {"auc": 0.7}).stop
    assert a.best_value == 0.7 and not a.observe(3, {"auc": 0.65}, can_stop=False).stop


@pytest.mark.parametrize("train, message", [
    ({"early_stop": {"metric": "accuracy"}}, "train.early_stop.metric: 'accuracy' is not one of"),
    ({"early_stop": {"patience": 0}}, "train.early_stop.patience: must be >= 1"),
    ({"early_stop": {"every": 0}}, "train.early_stop.every: must be >= 1"),
    ({"keep_best": True, "checkpoint": {"dir": "x"}}, "train.keep_best: needs train.early_stop"),
    ({"keep_best": True, "early_stop": {}}, "train.keep_best: needs train.checkpoint.dir"),
    ({"timing_warmup_steps": -1}, "train.timing_warmup_steps: must be >= 0"),
])
def test_bad_early_stop_settings_name_the_key(train, message):
    raw = copy.deepcopy(OVERFITS)
    raw["train"].update(train)
    with pytest.raises(ConfigError, match=message):
        config_from_mapping(raw)


def test_early_stopping_is_refused_for_a_multi_model_run():
    from pathlib import Path

    from cosparse.config import load_config

    path = Path(__file__).resolve().parents[1] / "configs/criteo_multi.yaml"
    with pytest.raises(ConfigError, match="train.early_stop: the models of a multi-model run"):
        load_config(path, {"train.early_stop": {"every": 5}})


def test_a_resumed_run_compares_with_the_best_before_it(tmp_path):
    """Cut after 20 steps (the run ends on its best checkpoint) and resumed: it stops where the
    uninterrupted run stops, with the same best, because the best came across the resume."""
    es = {"metric": "auc", "patience": 3, "every": 4}

    def train(root, steps, resume=False):
        raw = _raw(root, early_stop=es, keep_best=True)
        raw["train"]["steps"] = steps
        t = Trainer(config_from_mapping(raw), log=lambda m: None)
        try:
            if resume:
                t.resume(str(root / "ck"))
            return t.run()
        finally:
            t.close()

    whole = train(tmp_path / "whole", 120)
    part = train(tmp_path / "part", 20)
    assert part["early_stopped_at"] is None and part["best_step"] < 20
    again = train(tmp_path / "part", 120, resume=True)
    assert (again["best_step"], again["best_metric"], again["early_stopped_at"]) == \
        (whole["best_step"], whole["best_metric"], whole["early_stopped_at"])
