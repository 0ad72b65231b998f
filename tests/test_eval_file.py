"""Issue 33, items 3-5: ``data.eval_path`` (train on one file, evaluate on another), the
interactions reader saying which targets it dropped and why (``data.events.ties``), and
``data.negatives.eval_per_positive``. Every file is made here; each case runs from a config."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from cosparse.config import ConfigError, config_from_mapping
from cosparse.data.errors import DataError
from cosparse.train.inputs import model_inputs
from cosparse.train.trainer import Trainer
from tests.test_interactions import RUN as INTERACTIONS
from tests.test_interactions import _h, _samples

CSV_RUN = {
    "data": {"reader": "csv", "batch_size": 16,
             "columns": {"label": "click", "dense": ["price"]}},
    "model": {"kind": "dlrm", "bottom": [8], "top": [8, 1]},
    "tables": [{"name": "all", "dim": 8, "features": "auto"}],
    "train": {"steps": 3, "log_every": 1, "progress": False},
}


def _ctr(path: Path, rows: int, seed: int, site: str = "s") -> Path:
    rng = np.random.default_rng(seed)
    lines = ["click,site,hour,price"] + [
        f"{int(rng.random() < 0.3)},{site}{rng.integers(7)},{rng.integers(24)},"
        f"{rng.random():.3f}" for _ in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _csv_cfg(tmp_path: Path, **data) -> dict:
    raw = copy.deepcopy(CSV_RUN)
    raw["data"].update(path=str(_ctr(tmp_path / "train.csv", 80, 0)),
                       eval_path=str(_ctr(tmp_path / "eval.csv", 30, 1)), **data)
    return raw


def test_an_eval_file_evaluates_and_all_of_the_training_file_trains(tmp_path):
    inputs = model_inputs(config_from_mapping(_csv_cfg(tmp_path)))
    assert inputs.notes == [f"data.eval_path: training on 80 rows of {tmp_path / 'train.csv'}, "
                            f"evaluating on 30 rows of {tmp_path / 'eval.csv'}"]
    assert sum(len(inputs.train.build(t).labels) for t in inputs.train.tasks()) == 80
    want = np.loadtxt(tmp_path / "eval.csv", delimiter=",", skiprows=1, usecols=0)
    got = np.concatenate([inputs.eval.build(t).labels.numpy() for t in inputs.eval.tasks()])
    assert got.tolist() == want.tolist()
    t = Trainer(config_from_mapping(_csv_cfg(tmp_path)), log=lambda m: None)
    try:
        out = t.run()
        assert out["eval_samples"] == 30 and 0.0 <= out["auc"] <= 1.0
    finally:
        t.close()


@pytest.mark.parametrize("data, message", [
    ({"split": {"by": "position", "eval_fraction": 0.1}}, r"data.eval_path and data.split"),
    ({"eval_fraction": 0.2}, r"data.eval_path and data.eval_fraction"),
    ({"reader": "synthetic"}, r"data.eval_path: reader 'synthetic' does not read an eval file"),
])
def test_an_eval_file_beside_another_split_is_a_config_error_naming_both(tmp_path, data,
                                                                          message):
    with pytest.raises(ConfigError, match=message):
        config_from_mapping(_csv_cfg(tmp_path, **data))


def test_an_eval_file_whose_columns_differ_is_refused_naming_it(tmp_path):
    raw = _csv_cfg(tmp_path)
    raw["data"]["eval_path"] = str(_ctr(tmp_path / "ints.csv", 30, 1, site=""))  # site: ints
    with pytest.raises(ConfigError, match=r"column 'site' holds int values in .*ints.csv and "
                                          r"string in .*train.csv.*\(data.schema: \{site: "
                                          r"string\}\)$"):
        model_inputs(config_from_mapping(raw))
    (tmp_path / "short.csv").write_text("click,site,hour\n1,s1,3\n")
    raw["data"]["eval_path"] = str(tmp_path / "short.csv")
    with pytest.raises(DataError, match=r"short.csv: no column 'price'"):
        model_inputs(config_from_mapping(raw))


def _log(tmp_path: Path, name: str, text: str, **data):
    p = tmp_path / name
    p.write_text(text)
    raw = copy.deepcopy(INTERACTIONS)
    raw["data"].update({"path": str(p), "events": {"max_len": 5, "shuffle": False},
                        "columns": {"user": "uid", "item": "iid", "time": "day"}, **data})
    raw["data"].pop("split")
    return raw


DAYS = ("uid,iid,day\n"
        "a,x,1\n" "a,y,1\n" "a,z,2\n"   # a's x and y on one day: y has no strict history
        "b,x,1\n" "b,y,1\n"             # b: every event on one day
        "c,x,1\n" "c,z,3\n")


def test_the_reader_says_which_targets_it_dropped_and_ties_keep_file_order(tmp_path):
    strict = model_inputs(config_from_mapping(_log(tmp_path, "days.csv", DAYS,
                                                   eval_fraction=0.0001)))
    line = strict.train.describe()
    # a's x, b's x and c's x have no earlier event; a's y and b's y only one at the same time
    assert "2 samples, 2 positive, from 7 events; 5 target events dropped" in line, line
    assert "(2 of them only because those events have the same time: data.events.ties: " \
           "keep_file_order" in line
    assert "1 of the split's 3 users have no sample" in line  # b: both events on day 1
    kept = model_inputs(config_from_mapping(_log(
        tmp_path, "days.csv", DAYS, eval_fraction=0.0001,
        events={"max_len": 5, "shuffle": False, "ties": "keep_file_order"})))
    a, b = _h("a", "user"), _h("b", "user")
    x, y = _h("x", "item"), _h("y", "item")
    got = _samples(kept.train)
    assert (a, y, [x], 1.0) in got and (b, y, [x], 1.0) in got  # file order breaks the tie
    assert len(got) == len(_samples(strict.train)) + 2
    line = kept.train.describe()
    assert "3 target events dropped" in line and "same time" not in line, line


def test_an_eval_file_of_interactions_has_histories_from_both_files(tmp_path):
    (tmp_path / "later.csv").write_text("uid,iid,day\na,w,9\nc,w,9\nd,w,9\n")
    inputs = model_inputs(config_from_mapping(_log(tmp_path, "days.csv", DAYS,
                                                   eval_path=str(tmp_path / "later.csv"))))
    a, c = _h("a", "user"), _h("c", "user")
    w, x, y, z = (_h(i, "item") for i in "wxyz")
    assert sorted(_samples(inputs.eval)) == sorted([(a, w, [z, y, x], 1.0), (c, w, [z, x], 1.0)])
    assert "1 of the split's 3 users have no sample" in inputs.eval.describe()  # d: no history
    assert all(s[1] != w for s in _samples(inputs.train))


def test_eval_negatives_per_positive_differ_from_trainings(tmp_path):
    rng = np.random.default_rng(0)
    lines = [" ".join([str(u)] + [str(v) for v in rng.choice(200, 8, replace=False)])
             for u in range(30)]
    p = tmp_path / "seq.txt"
    p.write_text("\n".join(lines) + "\n")
    raw = copy.deepcopy(INTERACTIONS)
    raw["data"].update(path=str(p), negatives={"per_positive": 1, "eval_per_positive": 9})
    inputs = model_inputs(config_from_mapping(raw))
    train, ev = _samples(inputs.train), _samples(inputs.eval)
    assert sum(s[3] == 0.0 for s in train) == sum(s[3] == 1.0 for s in train)
    assert sum(s[3] == 0.0 for s in ev) == 9 * sum(s[3] == 1.0 for s in ev) > 0
