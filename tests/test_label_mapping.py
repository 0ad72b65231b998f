"""``data.columns.label`` as a mapping to 0/1 (``{column, positive: [...]}`` or ``{column,
threshold: x}``) in every file reader (csv, parquet, interactions) and in ``cosparse data
describe``; a label other than 0/1 without one is a bad record whose message suggests it; and
``cosparse data baseline --kind auto`` deciding by the labels."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from cosparse.cli import main as cli_main
from cosparse.config import ConfigError, LabelConfig, config_from_mapping
from cosparse.data.errors import DataError
from cosparse.features.csv_source import CsvRawSource
from cosparse.train.inputs import model_inputs

RUN = {
    "data": {"reader": "csv", "batch_size": 8, "eval_fraction": 0.25},
    "model": {"kind": "dlrm", "bottom": [4], "top": [4, 1]},
    "tables": [{"name": "t", "dim": 4, "features": "auto"}],
    "train": {"steps": 2, "progress": False},
}


def _csv(tmp_path: Path, header: str, rows: list[str], name: str = "x.csv") -> Path:
    p = tmp_path / name
    p.write_text(header + "\n" + "\n".join(rows) + "\n")
    return p


def _config(path: Path, label, **data) -> dict:
    raw = copy.deepcopy(RUN)
    raw["data"].update(path=str(path), columns={"label": label}, **data)
    return raw


def _labels(reader) -> list[float]:
    return [y for t in reader.tasks() for y in reader.build(t).labels.tolist()]


def test_minus_one_one_labels_map_by_a_positive_list(tmp_path):
    ys = [-1, 1, 1, -1, 1, -1, -1, 1] * 2
    p = _csv(tmp_path, "y,site", [f"{y},s{i % 3}" for i, y in enumerate(ys)])
    inputs = model_inputs(config_from_mapping(_config(p, {"column": "y", "positive": [1]})))
    assert inputs.train.keys == ["site"]  # the label is never a feature under sparse: auto
    assert _labels(inputs.train) + _labels(inputs.eval) == [float(y > 0) for y in ys]


def test_without_a_mapping_the_bad_label_suggests_one(tmp_path):
    p = _csv(tmp_path, "y,site", ["-1,a", "1,b"] * 4)
    source = CsvRawSource(p, 8, "train", 0.0, label="y")
    with pytest.raises(DataError, match=r"x.csv:2: bad label in column y \(expected 0 or 1\): "
                       r"'-1'; set data.columns.label: \{column: y, positive: \[\.\.\.\]\} or "
                       r"\{column: y, threshold: x\}"):
        source.build_raw(next(source.tasks()))


def test_ratings_map_by_a_threshold_and_text_by_its_values(tmp_path):
    ratings = [1, 5, 4, 3, 4.5, 2, 5, 1]
    p = _csv(tmp_path, "rating,liked,site", [f"{r},{'yes' if r >= 4 else 'no'},s{i}"
                                              for i, r in enumerate(ratings)])
    want = [float(r >= 4) for r in ratings]
    by_rating = CsvRawSource(p, 8, "train", 0.0, label=LabelConfig("rating", threshold=4),
                             exclude=["liked"])
    raw = by_rating.build_raw(next(by_rating.tasks()))
    assert raw.labels.tolist() == want and list(raw.columns) == ["site"]
    by_text = CsvRawSource(p, 8, "train", 0.0, label=LabelConfig("liked", positive=["yes"]),
                           exclude=["rating"])
    assert by_text.build_raw(next(by_text.tasks())).labels.tolist() == want


def test_a_value_the_mapping_cannot_read_is_a_bad_record(tmp_path):
    p = _csv(tmp_path, "rating,site", ["5,a", "n/a,b", "2,c", ",d"])
    rule = LabelConfig("rating", threshold=4)
    with pytest.raises(DataError, match=r"x.csv:3: bad label in column rating \(missing or not "
                       r"a number; positive when rating >= 4\): 'n/a'"):
        s = CsvRawSource(p, 8, "train", 0.0, label=rule, schema={"rating": "float32"})
        s.build_raw(next(s.tasks()))
    s = CsvRawSource(p, 8, "train", 0.0, "skip", label=rule, schema={"rating": "float32"})
    raw = s.build_raw(next(s.tasks()))
    assert raw.labels.tolist() == [1.0, 0.0] and raw.bad_records == 2


def test_parquet_labels_map_by_threshold_and_positive(tmp_path):
    pq.write_table(pa.table({"stars": pa.array([1, 4, 5, 2], pa.int8()),
                             "verdict": pa.array(["good", "bad", "good", None]),
                             "site": pa.array(["a", "b", "c", "d"])}), tmp_path / "x.parquet")
    raw = copy.deepcopy(RUN)
    raw["data"].update(reader="parquet", path=str(tmp_path / "x.parquet"), eval_fraction=0.0,
                       columns={"label": {"column": "stars", "threshold": 4},
                                "drop": ["verdict"]})
    inputs = model_inputs(config_from_mapping(raw))
    assert inputs.train.keys == ["site"] and _labels(inputs.train) == [0, 1, 1, 0]
    from cosparse.features import ParquetRawSource

    s = ParquetRawSource(tmp_path / "x.parquet", 8, "train", 0.0, "skip",
                         LabelConfig("verdict", positive=["good"]), exclude=["stars"])
    b = s.build_raw(next(s.tasks()))
    assert b.labels.tolist() == [1, 0, 1] and b.bad_records == 1  # (a null label)
    s = ParquetRawSource(tmp_path / "x.parquet", 8, "train", 0.0, label="stars")
    with pytest.raises(DataError, match=r"row 1 \(0-based\): bad label stars 4; set "
                       r"data.columns.label: \{column: stars, positive"):
        s.build_raw(next(s.tasks()))


def test_an_interaction_log_maps_its_ratings(tmp_path):
    rows = [f"u{u},i{(u * 7 + k) % 11},{k},{1 + (u + k) % 5}" for u in range(8) for k in range(5)]
    p = _csv(tmp_path, "user,item,ts,rating", rows)
    raw = copy.deepcopy(RUN)
    raw["data"] = {"reader": "interactions", "path": str(p), "batch_size": 8,
                   "events": {"max_len": 3, "shuffle": False}, "split": {"by": "last_per_user"},
                   "columns": {"user": "user", "item": "item", "time": "ts",
                               "label": {"column": "rating", "threshold": 4}}}
    from cosparse.features.interaction_log import load_interactions

    log = load_interactions(config_from_mapping(raw).data)
    ratings = np.array([1 + (u + k) % 5 for u in range(8) for k in range(5)])
    assert sorted(log.label.tolist()) == sorted((ratings >= 4).astype(float).tolist())
    raw["data"]["columns"]["label"] = {"column": "stars", "threshold": 4}
    with pytest.raises(DataError, match=r"x.csv: no label column 'stars' \(data.columns.label"):
        load_interactions(config_from_mapping(raw).data)  # (not silently implicit feedback)


@pytest.mark.parametrize("label, message", [
    ({"column": "y", "positive": [1], "threshold": 1}, r"data.columns.label: positive and "
     r"threshold both map the label; give one of them"),
    ({"column": "y", "positive": []}, r"data.columns.label.positive: list the label values"),
    ({"column": "", "threshold": 1}, r"data.columns.label.column: name the label column"),
    ({"column": "y", "positives": [1]}, r"unknown key 'data.columns.label.positives' \(did you "
     r"mean 'positive'\?\)"),
    ({"column": "y", "threshold": "high"}, r"data.columns.label.threshold"),
    ({"column": "y", "positive": [[1]]}, r"data.columns.label.positive\[0\]"),
])
def test_bad_label_mappings_are_config_errors_naming_the_key(tmp_path, label, message):
    p = _csv(tmp_path, "y,site", ["1,a"])
    with pytest.raises(ConfigError, match=message):
        config_from_mapping(_config(p, label))


def test_the_label_column_is_no_datetime_column_in_either_form(tmp_path):
    p = _csv(tmp_path, "y,site", ["1,a"])
    raw = _config(p, {"column": "y", "threshold": 1})
    raw["data"]["columns"]["datetime"] = {"y": {}}
    with pytest.raises(ConfigError, match=r"data.columns.datetime.y: column 'y' is the label"):
        config_from_mapping(raw)


def test_describe_shows_the_mapped_balance(tmp_path, capsys):
    p = _csv(tmp_path, "rating,site", [f"{1 + i % 5},s{i % 3}" for i in range(10)])
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(
        _config(p, {"column": "rating", "threshold": 4})))
    assert cli_main(["data", "describe", str(p), "--config", str(tmp_path / "c.yaml"),
                     "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "label: rating, 40.0% positive (4 of 10; positive when rating >= 4)" in out
    block = yaml.safe_load(out[out.index("data:\n"):])
    assert block["data"]["columns"]["label"] == {"column": "rating", "threshold": 4}


CLICKS = [f"{(u * 3 + i) % 2},u{u},i{(u + i) % 6}" for u in range(12) for i in range(4)]


def test_baseline_auto_scores_explicit_click_labels_by_logistic_regression(tmp_path, capsys):
    p = _csv(tmp_path, "click,user,item", CLICKS)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(_config(p, "click")))
    assert cli_main(["data", "baseline", "--config", str(tmp_path / "c.yaml")]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out.strip().splitlines()[-1])["baseline"] == "logistic"
    assert "baseline: logistic (explicit 0/1 labels" in captured.err


def test_baseline_auto_picks_popularity_for_implicit_feedback_only(tmp_path):
    from cosparse.train.baseline import auto_kind

    rows = [f"u{u},i{(u * 5 + k) % 9},{k}" for u in range(10) for k in range(4)]
    p = _csv(tmp_path, "user,item,ts", rows)
    raw = copy.deepcopy(RUN)
    raw["data"] = {"reader": "interactions", "path": str(p), "batch_size": 8,
                   "events": {"max_len": 2, "shuffle": False}, "split": {"by": "last_per_user"},
                   "columns": {"user": "user", "item": "item", "time": "ts"}}
    raw["tables"] = [{"name": "t", "dim": 4, "features": ["user", "item", "hist_item"]}]
    implicit = model_inputs(config_from_mapping(raw))  # every event a positive
    assert auto_kind(implicit.train, False)[0] == "popularity"
    assert auto_kind(implicit.train, True)[0] == "popularity"
    clicks = model_inputs(config_from_mapping(_config(_csv(tmp_path, "click,user,item", CLICKS,
                                                           "c.csv"), "click")))
    assert auto_kind(clicks.train, False)[0] == "logistic"
