"""``reader: libsvm``: libSVM / libFM lines (``label idx:val``, each token's position its feature,
its index the ID) and libFFM lines (``label field:idx:val``, the field its feature), told apart
per file, trained from a config alone; weighted values refused by file:line, malformed lines bad
records, and the split by position like the csv reader's."""

from __future__ import annotations

import copy
import gzip
from pathlib import Path

import numpy as np
import pytest

from cosparse.config import ConfigError, config_from_mapping
from cosparse.data.errors import DataError
from cosparse.features import kernels as FK
from cosparse.features.column_map import column_seed
from cosparse.train.inputs import model_inputs
from cosparse.train.trainer import Trainer

RUN = {
    "data": {"reader": "libsvm", "batch_size": 8, "eval_fraction": 0.25},
    "model": {"kind": "dlrm", "bottom": [4], "top": [4, 1]},
    "tables": [{"name": "t", "dim": 4, "features": "auto"}],
    "train": {"steps": 3, "log_every": 1, "progress": False},
}


def _svm_lines(n: int, seed: int = 0, minus: bool = True) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        y = ("+1" if i % 2 else "-1") if minus else str(i % 2)
        toks = [f"{rng.integers(1, 9)}:1", f"{rng.integers(10, 19)}:1"]
        out.append(" ".join([y, *toks, *([f"{20 + i % 4}:1"] if i % 3 else [])]))
    return out


def _write(path: Path, lines: list[str]) -> Path:
    text = ("\n".join(lines) + "\n").encode()
    path.write_bytes(gzip.compress(text) if path.suffix == ".gz" else text)
    return path


def _config(path: Path, **data) -> dict:
    raw = copy.deepcopy(RUN)
    raw["data"].update(path=str(path), **data)
    return raw


def _train(raw: dict) -> list[float]:
    t = Trainer(config_from_mapping(raw), log=lambda m: None)
    try:
        t.run(evaluate=True)
    finally:
        t.close()
    return t.losses


def _h(value: int, feature: str) -> int:
    return int(FK.hash_ints(np.array([value], np.int64), column_seed(0, feature), 0)[0])


def test_libsvm_with_minus_one_labels_trains_from_a_config_alone(tmp_path):
    lines = _svm_lines(32)
    raw = _config(_write(tmp_path / "a.svm", lines),
                  columns={"label": {"column": "label", "positive": [1]}})
    inputs = model_inputs(config_from_mapping(raw))
    assert inputs.train.keys == ["f0", "f1", "f2"]  # (the label column is no feature)
    b = inputs.train.build(next(inputs.train.tasks()))
    assert b.labels.tolist() == [0.0, 1.0] * 4
    ids, lengths = b.feature("f2")
    assert lengths.tolist() == [0, 1, 1, 0, 1, 1, 0, 1]  # a shorter line: an empty bag
    assert b.feature("f0")[0][0].item() == _h(int(lines[0].split()[1].split(":")[0]), "f0")
    assert ids[0].item() == _h(21, "f2")
    assert len(inputs.eval.build(next(inputs.eval.tasks())).labels) == 8
    losses = _train(raw)
    assert len(losses) == 3 and all(np.isfinite(losses))


def test_libfm_zero_one_labels_gzip_and_a_directory(tmp_path):
    (tmp_path / "d").mkdir()
    _write(tmp_path / "d/part0.libfm.gz", _svm_lines(16, 1, minus=False))
    _write(tmp_path / "d/part1.libfm", _svm_lines(16, 2, minus=False))
    raw = _config(tmp_path / "d", split={"by": "position", "eval_fraction": 0.5})
    inputs = model_inputs(config_from_mapping(raw))
    assert "train 16 rows" in inputs.notes[0] and "eval 16 rows" in inputs.notes[0]
    assert all(np.isfinite(_train(raw)))


def test_libffm_fields_name_the_features_and_a_field_is_a_bag(tmp_path):
    lines = [f"{i % 2} 0:{i % 5}:1 1:{10 + i % 3}:1 1:{20 + i % 4}:1 3:{i}:1" for i in range(32)]
    raw = _config(_write(tmp_path / "a.txt", lines))
    inputs = model_inputs(config_from_mapping(raw))
    assert inputs.train.keys == ["f0", "f1", "f3"]
    b = inputs.train.build(next(inputs.train.tasks()))
    ids, lengths = b.feature("f1")
    assert lengths.tolist() == [2] * 8 and ids[:2].tolist() == [_h(10, "f1"), _h(20, "f1")]
    assert all(np.isfinite(_train(raw)))


def test_weighted_values_are_refused_naming_the_line(tmp_path):
    p = _write(tmp_path / "a.svm", ["1 3:1 4:1", "0 3:1 4:0.5", "1 3:1"] * 4)
    with pytest.raises(DataError, match=r"a.svm:2: feature value 0.5 \(index 4\): cosparse bags "
                       r"have no per-ID weights.*refused, not dropped"):
        model_inputs(config_from_mapping(_config(p, eval_fraction=0.0, batch_size=16,
                                                 on_bad_record="skip")))


def test_malformed_lines_are_bad_records_named_by_file_and_line(tmp_path):
    p = _write(tmp_path / "a.svm", ["1 3:1 4:1", "0 3:1 4", "1 3:1", "2 5:1", ""] + ["0 1:1"] * 3)
    with pytest.raises(DataError, match=r"a.svm:2: a malformed token \(expected idx:val\)"):
        model_inputs(config_from_mapping(_config(p, eval_fraction=0.0, batch_size=16)))
    inputs = model_inputs(config_from_mapping(_config(p, eval_fraction=0.0, batch_size=16,
                                                      on_bad_record="skip")))
    b = inputs.train.build(next(inputs.train.tasks()))
    assert b.labels.tolist() == [1, 1, 0, 0, 0]  # (line 4's label is 2, line 5 is empty)
    assert "3 bad records on neither side" in inputs.notes[0]


def test_format_setting_and_mixed_files(tmp_path):
    (tmp_path / "d").mkdir()
    _write(tmp_path / "d/a.svm", ["1 3:1", "0 4:1"])
    _write(tmp_path / "d/b.ffm", ["1 0:3:1", "0 1:4:1"])
    with pytest.raises(DataError, match=r"a.svm holds libSVM lines but .*b.ffm libFFM lines"):
        model_inputs(config_from_mapping(_config(tmp_path / "d")))
    with pytest.raises(DataError, match=r"a.svm:1: a malformed token \(expected field:idx:val\)"):
        model_inputs(config_from_mapping(_config(tmp_path / "d/a.svm",
                                                 libsvm={"format": "ffm"})))
    with pytest.raises(ConfigError, match=r"data.columns.label.column: reader libsvm names its "
                       r"label column 'label'"):
        config_from_mapping(_config(tmp_path / "d/a.svm", columns={"label": "y"}))
