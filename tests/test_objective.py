"""Objectives (issue 34 item 2): a user's model of two tasks (a binary one, and a regression
weighted per sample and masked by the first) on a CSV made here, trained through
``cosparse.Trainer`` with the objective from YAML and from Python; the loss and the per-task
metrics against numpy by hand; config errors that name the key."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from objective_model import TABLES, TASKS, TwoTasks, mapping, write_csv

import cosparse
from cosparse.batch import SparseBatch
from cosparse.config import Config, ConfigError, from_dict, switch_preset
from cosparse.config.objective import ObjectiveConfig, TaskConfig
from cosparse.config.validate import validate
from cosparse.train.objective import objective_loss
from cosparse.train.task_metrics import first_ids, grouped_auc, task_scores


def _fit(model, config, objective=None):
    with cosparse.Trainer(model, config, objective=objective, log=lambda m: None) as t:
        return t.fit()


def test_two_tasks_from_yaml_and_from_python_train_alike(tmp_path):
    write_csv(tmp_path / "d.csv")
    metrics = tmp_path / "m.jsonl"
    cfg = mapping(tmp_path / "d.csv")
    cfg["train"]["metrics_json"] = str(metrics)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    from_yaml = _fit(TwoTasks(), str(tmp_path / "c.yaml"))
    from_python = _fit(TwoTasks(), mapping(tmp_path / "d.csv", objective=False),
                       cosparse.Objective(TASKS))
    assert len(from_yaml.losses) == 4 and all(np.isfinite(from_yaml.losses))
    assert from_yaml.losses == from_python.losses  # bit for bit
    for key in ("auc.ctr", "gauc.ctr", "logloss.ctr", "mse.watch", "mae.watch"):
        assert from_yaml.metrics[key] == from_python.metrics[key], key
        assert np.isfinite(from_yaml.metrics[key]), key
    assert "auc" not in from_yaml.metrics and from_yaml.metrics["eval_samples"] == 40
    evals = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert any(r.get("kind") == "eval" and "mse.watch" in r for r in evals)


def test_a_label_column_never_becomes_a_feature(tmp_path):
    write_csv(tmp_path / "d.csv")
    cfg = mapping(tmp_path / "d.csv")
    cfg["data"]["columns"]["dense"] = []  # auto: d1 (float) dense, ints sparse; never targets
    cfg = cosparse.load_config(cfg)
    from cosparse.train.inputs import model_inputs

    reader = model_inputs(cosparse.api.config.config_for_model(
        cfg, cosparse.EmbeddingBagCollection(TABLES).tables)).train
    assert reader.keys == ["user", "item"] and reader.dense_keys == ["d1"]


def _batch(click, watch, w) -> SparseBatch:
    n = len(click)
    return SparseBatch([], torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64),
                       torch.zeros(n, 0), torch.tensor(click, dtype=torch.float32),
                       task_labels={"ctr": torch.tensor(click, dtype=torch.float32),
                                    "watch": torch.tensor(watch, dtype=torch.float32)},
                       weights=torch.tensor(w, dtype=torch.float32))


def test_the_loss_is_the_weighted_masked_sum_over_the_batch_size():
    objective = ObjectiveConfig({"ctr": TaskConfig(), "watch": TaskConfig(
        kind="regression", loss="huber", delta=2.0, weight=0.5, mask="ctr")})
    x = {"ctr": torch.tensor([0.0, 1.0, -2.0, 0.5]), "watch": torch.tensor([1.0, 5.0, 0.0, 2.5])}
    batch = _batch([1, 0, 1, 1], [2.0, 0.0, 4.0, 2.0], [1.0, 2.0, 0.5, 1.0])
    got = float(objective_loss(objective, x, batch, torch.device("cpu")))
    y, w, m = np.array([1, 0, 1, 1.0]), np.array([1, 2, 0.5, 1.0]), np.array([1, 0, 1, 1.0])
    p = 1 / (1 + np.exp(-np.array([0.0, 1.0, -2.0, 0.5])))
    bce = -(y * np.log(p) + (1 - y) * np.log(1 - p))
    err = np.abs(np.array([1.0, 5.0, 0.0, 2.5]) - np.array([2.0, 0.0, 4.0, 2.0]))
    huber = np.where(err <= 2.0, 0.5 * err**2, 2.0 * (err - 0.5 * 2.0))
    want = ((bce * w).sum() + 0.5 * (huber * w * m).sum()) / 4
    assert got == pytest.approx(want, rel=1e-6)
    # the one binary task, label, is the mean BCE, bit for bit as before objectives
    one = ObjectiveConfig({"label": TaskConfig()})
    plain = SparseBatch([], batch.values, batch.lengths, batch.dense, batch.labels)
    assert torch.equal(objective_loss(one, x["ctr"], plain, torch.device("cpu")),
                       F.binary_cross_entropy_with_logits(x["ctr"], batch.labels))


def test_per_task_metrics_by_hand():
    objective = ObjectiveConfig({"ctr": TaskConfig(), "watch": TaskConfig(
        kind="regression", mask="ctr")})
    logits = np.array([2.0, -1.0, 0.5, -3.0], np.float32)
    out = task_scores(objective, {"ctr": logits, "watch": np.array([1, 9, 3, 9], np.float32)},
                      {"ctr": np.array([1, 0, 0, 1], np.float32),
                       "watch": np.array([2, 0, 0, 5], np.float32)},
                      np.array([1, 1, 1, 3], np.float32))
    # AUC: positives score 2.0 and -3.0, negatives -1.0 and 0.5: 2 of 4 pairs ranked right
    assert out["auc.ctr"] == 0.5
    p = 1 / (1 + np.exp(-logits.astype(np.float64)))
    y = np.array([1, 0, 0, 1.0])
    assert out["logloss.ctr"] == pytest.approx(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
    # watch is scored where ctr is 1 only: errors 1 and 4
    assert out["mse.watch"] == pytest.approx((1 + 16) / 2) and out["mae.watch"] == 2.5
    weighted = task_scores(objective, {"ctr": logits, "watch": np.array([1, 9, 3, 9], np.float32)},
                           {"ctr": y.astype(np.float32), "watch": np.array([2, 0, 0, 5], np.float32)},
                           np.array([1, 1, 1, 3], np.float32), weighted=True)
    assert weighted["mae.watch"] == pytest.approx((1 + 3 * 4) / 4)


def test_gauc_by_hand():
    """GAUC: each group's AUC weighted by its samples; a group of one class does not count."""
    y = np.array([1, 0, 0, 1, 1, 0, 1, 1, 0], np.float32)
    s = np.array([0.9, 0.1, 0.5, 0.2, 0.2, 0.2, 0.3, 0.8, 0.4])
    g = np.array([7, 7, 7, 3, 3, 3, 9, 9, 5])
    # group 7: the positive above both negatives: 1; group 3: the positives tie the negative:
    # 0.5; group 9: one class; group 5: one sample
    assert grouped_auc(y, s, g) == pytest.approx((3 * 1.0 + 3 * 0.5) / 6)
    assert np.isnan(grouped_auc(y[6:8], s[6:8], g[6:8]))
    assert first_ids(np.array([5, 6, 7]), np.array([2, 0, 1])).tolist() == [
        5, np.iinfo(np.int64).min, 7]


@pytest.mark.parametrize("change, match", [
    (lambda c: c["objective"]["tasks"]["watch"].update(loss="bce"),
     r"objective\.tasks\.watch\.loss: a regression task's loss is one of \['mse', 'huber'\]"),
    (lambda c: c["objective"]["tasks"]["watch"].update(mask="buy"),
     r"objective\.tasks\.watch\.mask: names another task"),
    (lambda c: c["objective"]["tasks"]["watch"].update(delta=0),
     r"objective\.tasks\.watch\.delta: must be"),
    (lambda c: c["objective"]["tasks"]["ctr"].update(weight=-1.0),
     r"objective\.tasks\.ctr\.weight: must be"),
    (lambda c: c["objective"]["tasks"]["ctr"].update(kind="ranking"),
     r"objective\.tasks\.ctr\.kind"),
    (lambda c: c["objective"]["tasks"]["watch"].update(group_by="user"),
     r"objective\.tasks\.watch\.group_by: groups the AUC of a binary task"),
    (lambda c: c["objective"]["tasks"].pop("watch"),
     r"objective\.tasks: tasks \['ctr'\], but the labels are \['ctr', 'watch'\]"),
    (lambda c: c.pop("objective"), r"data\.columns\.labels: names tasks"),
    (lambda c: c["data"]["columns"]["labels"].update(watch="click"),
     r"data\.columns\.labels\.watch: column 'click' is already"),
    (lambda c: c["data"]["columns"].update(dense=["w"]),
     r"data\.columns\.dense: column 'w' is already"),
    (lambda c: c["model"].update(kind="dlrm"),
     r"objective\.tasks: model\.kind 'dlrm' trains one task"),
    (lambda c: c["train"].update(early_stop={"metric": "auc.watch"}),
     r"train\.early_stop\.metric: 'auc\.watch' is not one of \['auc\.ctr', 'logloss\.ctr', "
     r"'gauc\.ctr', 'mse\.watch'"),
])
def test_config_errors_name_the_key(tmp_path, change, match):
    cfg = mapping(tmp_path / "d.csv")
    cfg["objective"] = {"tasks": {k: dict(v) for k, v in TASKS.items()}}
    cfg["tables"] = TABLES
    cfg["model"]["kind"] = None  # (a model of the user's own, as cosparse.load_config sets)
    change(cfg)
    with pytest.raises(ConfigError, match=match):  # (as `cosparse train` validates a config)
        validate(from_dict(Config, cfg))


def test_early_stopping_on_a_task_metric(tmp_path):
    write_csv(tmp_path / "d.csv")
    cfg = mapping(tmp_path / "d.csv")
    cfg["train"]["early_stop"] = {"metric": "mse.watch", "every": 2, "patience": 5}
    result = _fit(TwoTasks(), cfg)
    assert result.metrics["best_metric_name"] == "mse.watch"
    assert np.isfinite(result.metrics["best_metric"])


def test_several_labels_without_an_objective_are_refused(tmp_path):
    write_csv(tmp_path / "d.csv")
    with pytest.raises(ConfigError, match=r"data\.columns\.labels: names tasks \['ctr', 'watch'\]"):
        cosparse.Trainer(TwoTasks(), mapping(tmp_path / "d.csv", objective=False))
    with pytest.raises(ConfigError, match=r"objective: the config's objective section and the "
                                          r"Trainer's objective= differ"):
        cosparse.Trainer(TwoTasks(), mapping(tmp_path / "d.csv"),
                         cosparse.Objective(ctr={"kind": "binary"}, watch={"kind": "regression"}))


def test_parquet_reads_the_tasks_as_csv_does(tmp_path):
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    write_csv(tmp_path / "d.csv")
    pq.write_table(pcsv.read_csv(tmp_path / "d.csv"), tmp_path / "d.parquet")
    from_csv = _fit(TwoTasks(), mapping(tmp_path / "d.csv"))
    cfg = mapping(tmp_path / "d.parquet")
    cfg["data"]["reader"] = "parquet"
    from_parquet = _fit(TwoTasks(), cfg)
    assert from_parquet.losses == from_csv.losses
    assert from_parquet.metrics["mse.watch"] == from_csv.metrics["mse.watch"]


def test_a_group_by_feature_the_data_lacks_is_named(tmp_path):
    """(The objective on 2 ranks: ``tests/test_public_full_model.py``.)"""
    write_csv(tmp_path / "d.csv")
    cfg = mapping(tmp_path / "d.csv")
    cfg["objective"]["tasks"] = {**TASKS, "ctr": {"kind": "binary", "group_by": "nope"}}
    with pytest.raises(ConfigError, match=r"objective\.tasks\.ctr\.group_by: no feature 'nope' "
                                          r"in the data \(its features: user, item\)"):
        cosparse.Trainer(TwoTasks(), cfg)


def test_collaborative_workers_carry_the_tasks_labels_and_weights(tmp_path):
    """Architecture B: the data workers send each batch's tasks' labels and weights with its
    rows; the run is bit-identical to the resident one."""
    write_csv(tmp_path / "d.csv")
    raw = switch_preset(mapping(tmp_path / "d.csv"), "arch-b", {
        "store.remote.embedded": True, "store.remote.num_shards": 2, "store.device.rows": 48,
        "store.host.rows": 96, "supply.lookahead": 2})
    raw["data"]["workers"] = 2
    with cosparse.Trainer(TwoTasks(), raw, log=lambda m: None) as t:
        got = t.fit()
        assert t._engine.path.counters_b.batches == 4  # the workers delivered every batch
    ref = _fit(TwoTasks(), mapping(tmp_path / "d.csv"))
    assert got.losses == ref.losses
    assert got.metrics["mse.watch"] == ref.metrics["mse.watch"]


def test_the_dry_run_sizing_step_runs_the_objective(tmp_path):
    """A device budget sizes the tiers from a dry step of the model: its loss is the
    objective's (a model of several tasks returns a dict, which BCE alone cannot take)."""
    write_csv(tmp_path / "d.csv")
    cfg = mapping(tmp_path / "d.csv")
    cfg["store"] = {"device": {"budget_bytes": "1MiB"}}
    assert np.isfinite(_fit(TwoTasks(), cfg).losses).all()
