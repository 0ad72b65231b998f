"""``data.split``: which rows evaluate, by position, a flag column, time, a hashed key, or each
user's last row; batches of the chosen rows only, full-sized; the split logged at start-up
with both sides' rows and labels; a one-class eval side refused unless allowed."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cosparse.config import ConfigError, config_from_mapping
from cosparse.train.inputs import model_inputs
from cosparse.train.trainer import Trainer

# 60 rows: user u0..u11 (5 rows each, times increasing per user), a flag, a date
N = 60
USER = [f"u{i % 12}" for i in range(N)]
TS = [1_400_000_000 + 3600 * (i // 12) * 24 + 60 * i for i in range(N)]  # five days
FLAG = [int(i % 10 == 3) for i in range(N)]
LABEL = [int((i * 7) % 3 == 0) for i in range(N)]


def _csv(tmp_path: Path) -> Path:
    lines = ["user,ts,is_eval,day,item,label"]
    for i in range(N):
        day = f"2014-05-{13 + i // 12:02d}"
        lines.append(f"{USER[i]},{TS[i]},{FLAG[i]},{day},i{i % 7},{LABEL[i]}")
    p = tmp_path / "log.csv"
    p.write_text("\n".join(lines) + "\n")
    return p


RUN = {
    "data": {"reader": "csv", "batch_size": 8, "columns": {"drop": ["is_eval", "day"]}},
    "model": {"kind": "dlrm", "bottom": [4], "top": [4, 1]},
    "tables": [{"name": "t", "dim": 4, "features": "auto"}],
    "train": {"steps": 2, "log_every": 1, "progress": False},
}


def _inputs(tmp_path: Path, split: dict | None, **data):
    raw = copy.deepcopy(RUN)
    raw["data"].update(path=str(_csv(tmp_path)), split=split, **data)
    return model_inputs(config_from_mapping(raw))


def _rows(reader) -> list[int]:
    """The global row number of every row of a reader's batches, via its user and ts IDs."""
    out = []
    for t in reader.source.tasks():
        _, rows = reader.source.build_rows(t)
        out += rows.tolist()
    return out


@pytest.mark.parametrize("split, want_eval", [
    (None, list(range(48, 60))),
    ({"by": "position", "eval_fraction": 0.25}, list(range(45, 60))),
    ({"by": "column", "column": "is_eval"}, [i for i in range(N) if FLAG[i]]),
    ({"by": "time", "column": "ts", "at": TS[50]}, list(range(50, 60))),
    ({"by": "time", "column": "day", "at": "2014-05-16"}, list(range(36, 60))),
    ({"by": "time", "column": "ts", "at": "2014-05-16", "format": "unix_s"},
     [i for i in range(N) if TS[i] >= 1_400_198_400]),
    ({"by": "time", "column": "ts", "eval_fraction": 0.1}, list(range(54, 60))),
    ({"by": "last_per_user", "key": "user", "column": "ts"}, list(range(48, 60))),
])
def test_each_split_chooses_its_eval_rows(tmp_path, split, want_eval):
    inputs = _inputs(tmp_path, split)
    assert _rows(inputs.eval) == want_eval
    assert _rows(inputs.train) == [i for i in range(N) if i not in want_eval]
    batches = [inputs.train.build(t) for t in inputs.train.tasks()]
    assert [b.batch_size for b in batches[:-1]] == [8] * (len(batches) - 1)
    assert sum(b.batch_size for b in batches) == N - len(want_eval)
    labels = np.concatenate([b.labels.numpy() for b in batches])
    assert labels.tolist() == [LABEL[i] for i in range(N) if i not in want_eval]
    pos = sum(LABEL[i] for i in want_eval) / len(want_eval)
    assert f"eval {len(want_eval):,} rows ({pos:.1%} positive)" in inputs.notes[0]


def test_a_hash_split_keeps_every_user_on_one_side(tmp_path):
    inputs = _inputs(tmp_path, {"by": "hash", "key": "user", "eval_fraction": 0.3, "seed": 4})
    ev, tr = _rows(inputs.eval), _rows(inputs.train)
    assert sorted(ev + tr) == list(range(N)) and ev and tr
    assert not {USER[i] for i in ev} & {USER[i] for i in tr}
    again = _inputs(tmp_path, {"by": "hash", "key": "user", "eval_fraction": 0.3, "seed": 4})
    assert _rows(again.eval) == ev  # seeded: the same users every run


def test_resuming_mid_split_gives_the_same_batches(tmp_path):
    inputs = _inputs(tmp_path, {"by": "column", "column": "is_eval"})
    r = inputs.train
    whole = [r.build(t) for t in r.tasks()]
    tail = [r.build(t) for t in r.tasks(3)]
    assert [b.index for b in tail] == [3, 4, 5, 6]
    for a, b in zip(whole[3:], tail, strict=True):
        assert a.values.tolist() == b.values.tolist() and a.labels.tolist() == b.labels.tolist()


def test_the_split_is_logged_and_a_one_class_eval_side_is_refused(tmp_path):
    raw = copy.deepcopy(RUN)
    raw["data"].update(path=str(_csv(tmp_path)), split={"by": "column", "column": "is_eval"})
    lines: list[str] = []
    t = Trainer(config_from_mapping(raw), log=lines.append)
    try:
        t.run(evaluate=False)
    finally:
        t.close()
    assert lines[0].startswith("split by column: train 54 rows (")
    one_class = {"by": "time", "column": "ts", "at": TS[59]}  # one row: label 0
    with pytest.raises(ConfigError, match="eval side's 1 rows are all label 0"):
        _inputs(tmp_path, one_class)
    allowed = _inputs(tmp_path, one_class, allow_one_class_eval=True)
    assert "warning: the eval side has one label only" in allowed.notes[0]


@pytest.mark.parametrize("data, message", [
    ({"split": {"by": "column"}}, r"data.split.column: by column needs it"),
    ({"split": {"by": "hash", "eval_fraction": 0.2}}, r"data.split.key: by hash needs it"),
    ({"split": {"by": "hash", "key": "user", "at": 5}}, r"data.split.at: only by time"),
    ({"split": {"by": "column", "column": "is_eval", "eval_fraction": 0.2}},
     r"data.split.eval_fraction: by column decides each row itself"),
    ({"split": {"by": "time", "column": "ts", "at": 1, "eval_fraction": 0.2}},
     r"data.split: by time takes at or eval_fraction, not both"),
    ({"split": {"by": "sideways"}}, r"data.split.by: 'sideways' is not one of"),
    ({"split": {"by": "position", "eval_fraction": 1.5}}, r"data.split.eval_fraction"),
    ({"reader": "criteo_tsv", "columns": None, "split": {"by": "position"}},
     r"data.split: splits the rows of reader csv"),
])
def test_bad_split_keys_are_config_errors_naming_the_key(tmp_path, data, message):
    raw = copy.deepcopy(RUN)
    raw["data"].update(path=str(_csv(tmp_path)), **data)
    if raw["data"]["reader"] != "csv":
        raw["tables"][0]["features"] = ["C1"]
    with pytest.raises(ConfigError, match=message):
        model_inputs(config_from_mapping(raw))


def test_a_split_column_the_data_lacks_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"data.split.column: no column 'nope' in the data "
                                          r"\(columns: user, ts, is_eval, day, item, label\)"):
        _inputs(tmp_path, {"by": "column", "column": "nope"})
    with pytest.raises(ConfigError, match=r"data.split.key: no column 'uid'"):
        _inputs(tmp_path, {"by": "hash", "key": "uid"})


def test_parquet_splits_the_same_way(tmp_path):
    pq.write_table(pa.table({"user": USER, "ts": TS, "label": LABEL}), tmp_path / "x.parquet",
                   row_group_size=7)
    raw = copy.deepcopy(RUN)
    raw["data"].update(reader="parquet", path=str(tmp_path / "x.parquet"), columns={},
                       split={"by": "last_per_user", "key": "user", "column": "ts"})
    inputs = model_inputs(config_from_mapping(raw))
    assert _rows(inputs.eval) == list(range(48, 60))
    assert sum(inputs.train.build(t).batch_size for t in inputs.train.tasks()) == 48


def test_a_split_over_files_reads_the_same_rows_as_over_one(tmp_path):
    import gzip

    lines = _csv(tmp_path).read_text().splitlines(keepends=True)
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "a.csv.gz").write_bytes(gzip.compress("".join(lines[:30]).encode()))
    (parts / "b.csv").write_text(lines[0] + "".join(lines[30:]))
    split = {"by": "hash", "key": "user", "eval_fraction": 0.5, "seed": 1}
    one = _inputs(tmp_path, split)
    raw = copy.deepcopy(RUN)
    raw["data"].update(path=str(parts), split=split)
    two = model_inputs(config_from_mapping(raw))
    for side in ("train", "eval"):
        a, b = getattr(one, side), getattr(two, side)
        assert _rows(a) == _rows(b)
        for x, y in zip(a.tasks(), b.tasks(), strict=True):
            assert a.build(x).values.tolist() == b.build(y).values.tolist()
