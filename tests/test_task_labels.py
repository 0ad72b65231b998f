"""Several tasks' labels (``data.columns.labels``) for readers interactions and taobao_events
(issue 34 item 2): each task's labels are the one-label reader's under that task's mapping,
sampled negatives are 0 for every task, conflicting keys are config errors naming both, and an
eval side on which a binary task has one class is refused naming the task."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

import cosparse
from cosparse.config import ConfigError
from cosparse.train.inputs import model_inputs

BEHAVIOURS = ("pv", "cart", "fav", "buy")
TASKS = {"engage": {"column": "behavior_type", "positive": ["cart", "fav", "buy"]},
         "buy": {"column": "behavior_type", "positive": ["buy"]}}


def _taobao_log(path: Path, users: int = 30, per_user: int = 12, seed: int = 0) -> Path:
    """A Taobao-style log (``user,item,category,behavior,ts``, no header) made here."""
    rng = np.random.default_rng(seed)
    lines = []
    for u in range(1, users + 1):
        for k in range(per_user):
            b = rng.choice(BEHAVIOURS, p=[0.6, 0.15, 0.1, 0.15])
            lines.append(f"{u},{rng.integers(1, 80)},{rng.integers(1, 9)},{b},"
                         f"{1511500000 + 60 * k + u}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _taobao(path: Path, labels: dict | None = None, **events) -> dict:
    raw = {"data": {"reader": "taobao_events", "path": str(path), "batch_size": 16,
                    "events": {"max_len": 4, "shuffle": True, "seed": 1, **events}},
           "tables": [{"name": "ids", "dim": 4, "features": ["user", "target_item"]}],
           "train": {"steps": 2, "progress": False}}
    if labels is not None:
        raw["data"]["columns"] = {"labels": labels}
        raw["objective"] = {"tasks": {t: {"kind": "binary"} for t in labels}}
    return raw


def _all(reader, what):
    return np.concatenate([what(reader.build(t)) for t in reader.tasks()])


def test_taobao_tasks_are_the_one_label_readers_labels_of_their_behaviours(tmp_path):
    log = _taobao_log(tmp_path / "log.csv")
    tasks = model_inputs(cosparse.load_config(_taobao(log, TASKS)))
    for task, rule in TASKS.items():
        one = model_inputs(cosparse.load_config(_taobao(log, positive=rule["positive"])))
        for split in ("train", "eval"):
            mine, theirs = getattr(tasks, split), getattr(one, split)
            got = _all(mine, lambda b, t=task: b.task_labels[t].numpy())
            assert np.array_equal(got, _all(theirs, lambda b: b.labels.numpy())), (task, split)
            assert 0 < got.sum() < len(got)
    ids = _all(tasks.train, lambda b: b.values.numpy())
    assert np.array_equal(ids, _all(one.train, lambda b: b.values.numpy()))  # same samples


@pytest.mark.parametrize("change, message", [
    (lambda r: r["data"]["events"].update(positive=["buy"]),
     "data.events.positive and data.columns.labels"),
    (lambda r: r["data"]["columns"]["labels"]["buy"].update(column="behavior"),
     "data.columns.labels.buy: .*behavior_type"),
    (lambda r: r["data"]["columns"]["labels"]["buy"].update(positive=["click"]),
     r"data.columns.labels.buy.positive: .*\['click'\]"),
    (lambda r: r["data"]["columns"]["labels"]["buy"].update(positive=["cart", "fav", "buy"]),
     "data.columns.labels.buy: gives task buy the labels of task engage"),
    (lambda r: r["data"]["columns"].update(dense=["ts"]), "data.columns: reader taobao_events"),
    (lambda r: r["data"].update(reader="libsvm"), "not 'libsvm'.*data.columns.label\\)"),
    (lambda r: r["tables"][0].update(features="auto"), r"tables\[0\].features: 'auto' takes"),
])
def test_conflicting_or_unknown_task_labels_are_config_errors(tmp_path, change, message):
    raw = copy.deepcopy(_taobao(tmp_path / "log.csv", copy.deepcopy(TASKS)))
    change(raw)
    with pytest.raises(ConfigError, match=message):
        cosparse.load_config(raw)


def _interactions(path: Path, negatives: dict | None = None) -> dict:
    raw = {"data": {"reader": "interactions", "path": str(path), "batch_size": 16,
                    "csv": {"header": "none", "names": ["user", "item", "cat", "behavior", "ts"]},
                    "events": {"max_len": 4, "shuffle": False},
                    "columns": {"user": "user", "item": "item", "time": "ts",
                                "labels": {"click": {"column": "behavior",
                                                     "positive": list(BEHAVIOURS)},
                                           "buy": {"column": "behavior", "positive": ["buy"]}}}},
           "objective": {"tasks": {"click": {}, "buy": {}}},
           "tables": [{"name": "ids", "dim": 4, "features": ["user", "item"]}],
           "train": {"steps": 2, "progress": False}}
    if negatives is not None:
        raw["data"]["negatives"] = negatives
    return raw


def test_interaction_tasks_and_their_sampled_negatives_zero_for_every_task(tmp_path):
    """Every event is an interaction (click 1), buy is its behaviour; each sampled negative is
    0 for both tasks, and the events keep their labels and order (the eval split: each event,
    then its negatives)."""
    log = _taobao_log(tmp_path / "log.csv", seed=2)
    raw = _interactions(log)
    with pytest.raises(ConfigError, match="task click: .* all label 1"):  # (no negatives)
        model_inputs(cosparse.load_config(raw))
    raw["data"]["allow_one_class_eval"] = True
    plain = model_inputs(cosparse.load_config(raw))
    with_neg = model_inputs(cosparse.load_config(
        _interactions(log, {"per_positive": 2, "seed": 3})))
    for split in ("train", "eval"):
        r, base = getattr(with_neg, split), getattr(plain, split)
        event = _all(r, lambda b: b.labels.numpy()) == 1.0  # (the event marker: 0 a negative)
        click, buy = (_all(r, lambda b, t=t: b.task_labels[t].numpy()) for t in ("click", "buy"))
        assert (~event).sum() == 2 * event.sum() and event.sum() == base.num_samples
        assert not click[~event].any() and not buy[~event].any()
        assert click[event].all()
        want = _all(base, lambda b: b.task_labels["buy"].numpy())
        assert 0 < want.sum() < len(want)
        if split == "eval":  # (time order; train is the same multiset, shuffled by negatives)
            assert np.array_equal(buy[event], want)
        else:
            assert buy[event].sum() == want.sum()
    assert "click 100.0% positive, buy " in plain.notes[0]
    assert "warning: task click" in plain.notes[-1]
    raw["data"]["events"]["layout"] = "user_items"  # (users and items only: no label columns)
    raw["data"]["columns"] = {"labels": raw["data"]["columns"]["labels"]}
    with pytest.raises(ConfigError, match="user_items file .*data.columns.labels"):
        cosparse.load_config(raw)


def test_an_eval_side_of_one_class_of_a_task_is_refused_naming_the_task(tmp_path):
    """The one-label split refuses an eval side of one class (AUC undefined); so does each
    binary task's: a csv split, and the interactions reader's eval events."""
    rows = ["u,i,click,rare"] + [f"{k % 7},{k % 11},{k % 2},{int(k < 20)}" for k in range(100)]
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n")
    raw = {"data": {"reader": "csv", "path": str(tmp_path / "d.csv"), "batch_size": 16,
                    "eval_fraction": 0.2,
                    "columns": {"labels": {"click": "click", "rare": "rare"}}},
           "objective": {"tasks": {"click": {}, "rare": {}}},
           "tables": [{"name": "ids", "dim": 4, "features": ["u", "i"]}],
           "train": {"steps": 2, "progress": False}}
    with pytest.raises(ConfigError, match=r"task rare: its 20 eval samples are all label 0.*"
                                          r"data.allow_one_class_eval"):
        model_inputs(cosparse.load_config(raw))
    raw["data"]["allow_one_class_eval"] = True
    notes = model_inputs(cosparse.load_config(raw)).notes
    assert any("warning: task rare" in n for n in notes) and not any("click" in n for n in notes)
    log = _taobao_log(tmp_path / "log.csv", seed=2)
    text = log.read_text().splitlines()
    late = sorted(text, key=lambda s: int(s.rsplit(",", 1)[1]))[-len(text) // 4:]
    log.write_text("\n".join(s.replace(",buy,", ",pv,") if s in late else s
                             for s in text) + "\n")
    with pytest.raises(ConfigError, match="task buy: its .* eval samples are all label 0"):
        model_inputs(cosparse.load_config(_interactions(log)))
