"""Behaviour sequences as versioned features: the event log's raw columns (EventLogRawSource) equal
the event reader's features batch by batch, DIN trained through the feature platform is
bit-identical to DIN on the reader, the time-windowed ``history`` transform on the real sample,
and bad specs over the log fail at start-up."""

from __future__ import annotations

import copy
import math
import pickle
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_din import TINY  # user 7: not time-sorted in the file; two events share t=300
from test_feature_training import train

from cosparse.config import ConfigError, EventsConfig, config_from_mapping
from cosparse.data.events import TaobaoEventsReader
from cosparse.features import EventLogRawSource, FeatureExtractor, FeatureSpecError, load_spec
from cosparse.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
TAOBAO = ROOT.parent / "shared/data/taobao-userbehavior/UserBehavior_head84k.csv"
SPEC = ROOT / "configs/features/taobao_din.yaml"
needs_taobao = pytest.mark.skipif(not TAOBAO.exists(), reason="../shared/data/taobao is not present")
DAY = 86_400
HIST = {"hist_item": "hist_item_id", "hist_cate": "hist_category_id",
        "hist_btag": "hist_behavior_type"}
TARGET = {"user": "user_id", "target_item": "item_id", "target_cate": "category_id"}



def assert_same_batches(src: EventLogRawSource, reader: TaobaoEventsReader) -> int:
    """Every batch of ``src`` holds the reader's features as raw columns; returns the batches."""
    tasks = list(src.tasks())
    assert len(tasks) == src.num_batches == reader.num_batches > 0
    for task, rtask in zip(tasks, reader.tasks(), strict=True):
        raw, ref = src.build_raw(task), reader.build(rtask)
        assert raw.index == ref.index and raw.bad_records == ref.bad_records
        assert np.array_equal(raw.labels, ref.labels.numpy())
        for feat, col in {**HIST, **TARGET}.items():
            v, ln = ref.feature(feat)
            c = raw.columns[col]
            assert np.array_equal(c.values, v.numpy()), (task.index, feat)
            if feat in HIST:
                assert np.array_equal(c.lengths, ln.numpy()), (task.index, feat)
            else:
                assert c.lengths is None and ln.eq(1).all()
        ts, hts = raw.columns["timestamp"], raw.columns["hist_timestamp"]
        assert np.array_equal(hts.lengths, raw.columns["hist_item_id"].lengths)
        row = np.repeat(np.arange(raw.num_rows), hts.lengths)
        assert (hts.values < ts.values[row]).all()  # strictly before the target
        step = np.diff(hts.values)
        same_row = row[1:] == row[:-1]
        assert (step[same_row] <= 0).all()  # most recent first
    return len(tasks)


def test_tiny_log_columns_and_histories(tmp_path):
    p = tmp_path / "events.csv"
    p.write_text(TINY)
    ev = EventsConfig(shuffle=False)
    src = EventLogRawSource(p, 4, "train", 0.0, events=ev)
    assert assert_same_batches(src, TaobaoEventsReader(p, 4, "train", 0.0, events=ev)) == 2
    src = pickle.loads(pickle.dumps(src))  # workers receive it pickled
    rows = {}
    for task in src.tasks():
        raw = src.build_raw(task)
        hist = {c: raw.columns[c].to_pylist() for c in ("hist_item_id", "hist_timestamp",
                                                        "hist_behavior_type")}
        for i, item in enumerate(raw.columns["item_id"].to_pylist()):
            rows[item] = (raw.columns["timestamp"].to_pylist()[i],
                          raw.columns["behavior_type"].to_pylist()[i],
                          *(hist[c][i] for c in hist))
    assert rows[73] == (400, 3, [74, 72, 75, 71], [300, 300, 200, 100], [2, 1, 3, 0])
    assert rows[72] == (300, 1, [75, 71], [200, 100], [3, 0])
    assert rows[91] == (250, 3, [90], [150], [0])
    assert set(rows) == {75, 72, 74, 73, 70, 91}


@needs_taobao
@pytest.mark.parametrize("split", ["train", "eval"])
def test_raw_source_equals_the_event_reader_batch_by_batch(split):
    ev = EventsConfig(max_len=50, seed=3)
    src = EventLogRawSource(TAOBAO, 512, split, 0.2, events=ev)
    assert set(src.columns) == {"user_id", "item_id", "category_id", "behavior_type", "timestamp",
                                "hist_item_id", "hist_category_id", "hist_behavior_type",
                                "hist_timestamp"}
    assert assert_same_batches(src, TaobaoEventsReader(TAOBAO, 512, split, 0.2, events=ev)) > 10


# --- training ------------------------------------------------------------------------------------
def din_config(name: str, steps: int, **features) -> dict:
    raw = yaml.safe_load((ROOT / "configs" / name).read_text())
    raw["data"]["path"] = str(TAOBAO)
    raw["train"].update(steps=steps, progress=False, log_every=1000)
    if "features" in raw:
        raw["features"] = {**raw["features"], "spec": str(SPEC), **features}
    return raw



@needs_taobao
def test_din_through_the_platform_trains_bit_identically_to_the_reader():
    direct = train(din_config("taobao_din.yaml", 30))
    platform = train(din_config("taobao_din_features.yaml", 30))
    assert len(direct.losses) == 30
    assert platform.losses == direct.losses
    in_workers = din_config("taobao_din_features.yaml", 30)
    in_workers["data"]["workers"] = 2  # the source travels pickled to forkserver workers
    assert train(in_workers).losses == direct.losses
    assert platform.final["auc"] == direct.final["auc"]
    assert platform.features_computed == 30 * 6 and direct.features_computed == 0
    tables = {t.name: t.features for t in platform.cfg.tables}
    assert tables == {"item": ["target_item", "hist_item"], "cate": ["target_cate", "hist_cate"],
                      "user": ["user"], "btag": ["hist_btag"]}


# --- the history transform on the real sample ----------------------------------------------------
@needs_taobao
def test_one_day_history_keeps_only_the_last_day_and_trains():
    doc = yaml.safe_load(SPEC.read_text())
    item_1d = next(f for f in doc["features"] if f["name"] == "hist_item_1d")
    assert item_1d["transforms"][0] == {"history": {"window_s": DAY}}
    # the same transforms over the timestamps: the time of each element hist_item_1d keeps
    doc["features"].append({**copy.deepcopy(item_1d), "name": "hist_ts_1d",
                            "inputs": ["hist_timestamp", "hist_timestamp", "timestamp"]})
    from cosparse.features import parse_spec

    fs = parse_spec(doc)
    src = EventLogRawSource(TAOBAO, 1024, "train", 0.2, events=EventsConfig(max_len=50))
    fs.check_source(src.columns)
    ex = FeatureExtractor(fs, ["hist_item", "hist_item_1d", "hist_cate_1d", "hist_ts_1d"])
    kept = total = 0
    for task in src.tasks():
        raw = src.build_raw(task)
        fb = ex.extract(raw)
        item, ts = fb.columns["hist_item_1d"], fb.columns["hist_ts_1d"]
        full = fb.columns["hist_item"]
        assert np.array_equal(item.lengths, ts.lengths)
        assert np.array_equal(fb.columns["hist_cate_1d"].lengths, item.lengths)
        assert (item.lengths <= 20).all() and (item.lengths <= full.lengths).all()
        target_ts = np.repeat(raw.columns["timestamp"].values, ts.lengths)
        assert ((ts.values >= target_ts - DAY) & (ts.values < target_ts)).all()
        # a reference: the raw history's elements within the day, in order, the 20 most recent
        hts, hi = raw.columns["hist_timestamp"], raw.columns["hist_item_id"]
        row_ts = np.repeat(raw.columns["timestamp"].values, hts.lengths)
        inside = (hts.values >= row_ts - DAY) & (hts.values < row_ts)
        csum = np.cumsum(inside)  # then the first 20 of each row: the most recent
        starts = np.concatenate([[0], np.cumsum(hts.lengths)[:-1]]).astype(np.int64)
        before = np.concatenate([[0], csum])[starts]
        inside &= csum - np.repeat(before, hts.lengths) <= 20
        assert np.array_equal(item.values, hi.values[inside])
        row = np.repeat(np.arange(raw.num_rows), hts.lengths)
        assert np.array_equal(item.lengths, np.bincount(row[inside], minlength=raw.num_rows))
        kept += int(item.lengths.sum())
        total += int(full.lengths.sum())
    assert 0 < kept < total  # the window drops events: the transform does real work

    raw_cfg = din_config("taobao_din_features.yaml", 8, consumer="din_1d")
    raw_cfg["model"]["din"]["pairs"] = [["target_item", "hist_item_1d"],
                                        ["target_cate", "hist_cate_1d"]]
    run = train(raw_cfg)
    assert len(run.losses) == 8 and all(math.isfinite(x) for x in run.losses)
    assert run.features_computed == 8 * 6 and math.isfinite(run.final["auc"])
    tables = {t.name: t.features for t in run.cfg.tables}
    assert tables["item"] == ["target_item", "hist_item_1d"] and tables["btag"] == ["hist_btag_1d"]


# --- bad input -----------------------------------------------------------------------------------
def bad_spec(tmp_path: Path, feature: dict) -> Path:
    doc = yaml.safe_load(SPEC.read_text())
    doc["features"].append(feature)
    doc["models"][0]["consumes"].append(feature["name"])
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


@needs_taobao
@pytest.mark.parametrize("feature,match", [
    ({"name": "item_1d", "inputs": ["item_id", "hist_timestamp", "timestamp"], "kind": "sequence",
      "table": "item", "transforms": [{"history": {"window_s": DAY}}]},
     r"feature 'item_1d': transforms\[0\]\.history: needs a jagged values column as input 0, "
     r"got int"),
    ({"name": "hist_price_1d", "inputs": ["hist_price", "hist_timestamp", "timestamp"],
      "kind": "sequence", "table": "item", "transforms": [{"history": {"window_s": DAY}}]},
     r"feature 'hist_price_1d'\.inputs: unknown input 'hist_price'"),
])
def test_a_bad_spec_over_the_event_log_fails_at_start_up(tmp_path, feature, match):
    spec = bad_spec(tmp_path, feature)
    src = EventLogRawSource(TAOBAO, 256, "train", 0.2, events=EventsConfig(max_len=50))
    with pytest.raises(FeatureSpecError, match=match):
        load_spec(spec).check_source(src.columns)
    raw = din_config("taobao_din_features.yaml", 2)
    raw["features"]["spec"] = str(spec)
    with pytest.raises(ConfigError, match="features.spec: .*" + match):
        Trainer(config_from_mapping(raw), log=lambda m: None)
