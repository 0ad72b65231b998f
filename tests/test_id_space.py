"""data.columns.id_space (issue 32, item 3): a DIN over ``reader: csv`` whose target column and
history column name one entity shares one ID space, and a DIN whose target never occurs in its
history warns. Data: the Alimama display-ad sample (500 rows, history over 50 columns), written
as a target column and a list column."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from cosparse.config import ColumnsConfig, ConfigError, config_from_mapping
from cosparse.features.column_map import ColumnMapReader
from cosparse.features.csv_source import CsvRawSource
from cosparse.train.din_overlap import din_overlap, target_in_history
from cosparse.train.inputs import model_inputs
from cosparse.train.trainer import Trainer

ALIMAMA = Path(__file__).resolve().parents[2] / "shared/data/taobao-alimama-dmr-sample" \
    / "alimama_sampled_train.txt"


@pytest.fixture(scope="module")
def din_csv(tmp_path_factory) -> tuple[Path, int]:
    """(a CSV of label, cate, hist_cate and brand, samples whose category is in their history)."""
    if not ALIMAMA.exists():
        pytest.skip(f"{ALIMAMA} is absent")
    raw = np.genfromtxt(ALIMAMA, delimiter=",", dtype=np.int64, filling_values=0)
    hist, mask, cate = raw[:, 50:100], raw[:, 150:200] == 1, raw[:, 260]
    lines = ["label,cate,hist_cate,brand"]
    in_history = 0
    for row, h, m, c in zip(raw, hist, mask, cate, strict=True):
        events = h[m].tolist()
        in_history += int(c in events)
        lines.append(f"{row[266]},{c},{'|'.join(map(str, events))},{row[263]}")
    path = tmp_path_factory.mktemp("din") / "alimama.csv"
    path.write_text("\n".join(lines) + "\n")
    return path, in_history


def _reader(path: Path, **cols) -> ColumnMapReader:
    source = CsvRawSource(path, 500, "train", 0.0, label="label",
                          schema={"hist_cate": "list<int64>"})
    return ColumnMapReader(source, ColumnsConfig(label="label", sequence=["hist_cate"], **cols))


def test_a_shared_id_space_keeps_the_target_in_its_history(din_csv):
    path, in_history = din_csv
    assert in_history == 303  # the sample's own figure: 303 of 500 rows
    apart = _reader(path)
    hits, seen = target_in_history(apart.build(next(apart.tasks())), "cate", "hist_cate")
    assert (hits, seen) == (0, 500)  # each column its own seed: never one ID
    shared = _reader(path, id_space={"cate": ["hist_cate"]})
    batch = shared.build(next(shared.tasks()))
    assert target_in_history(batch, "cate", "hist_cate") == (303, 500)
    assert shared.seeds["hist_cate"] == shared.seeds["cate"] != shared.seeds["brand"]


DIN_RUN = {
    "data": {"reader": "csv", "batch_size": 100, "eval_fraction": 0.2,
             "schema": {"hist_cate": "list<int64>"},
             "columns": {"label": "label", "sequence": ["hist_cate"]}},
    "model": {"kind": "din", "din": {"pairs": [["cate", "hist_cate"]], "attention": [8],
                                     "mlp": [8]}},
    "tables": [{"name": "cate", "dim": 8, "features": ["cate", "hist_cate"], "pooling": "none"},
               {"name": "brand", "dim": 8, "features": ["brand"]}],
    "train": {"steps": 2, "log_every": 1, "progress": False},
}


@pytest.mark.parametrize("shared", [False, True])
def test_a_din_whose_target_never_occurs_in_its_history_warns(din_csv, shared):
    raw = copy.deepcopy(DIN_RUN)
    raw["data"]["path"] = str(din_csv[0])
    if shared:
        raw["data"]["columns"]["id_space"] = {"cate": ["hist_cate"]}
    cfg = model_inputs(config_from_mapping(raw)).cfg
    counts = din_overlap(cfg, model_inputs(cfg).train)
    hits, seen = counts[("cate", "hist_cate")]
    assert seen > 0 and (hits > 0) == shared
    said: list[str] = []
    t = Trainer(config_from_mapping(raw), log=said.append)
    try:
        warned = [m for m in said if "model.din.pairs [cate, hist_cate]" in m]
        assert bool(warned) != shared, said
        if warned:
            assert "data.columns.id_space: {cate: [hist_cate]}" in warned[0]
    finally:
        t.close()


@pytest.mark.parametrize("id_space, message", [
    ({"cate": ["hist_cate"], "brand": ["cate"]}, r"id_space.brand: column 'cate' is already in "
                                                  r"the ID space of 'cate'"),
    ({"cate": ["label"]}, r"id_space.cate: column 'label' is the label, not an ID column"),
    ({"cate": ["nope"]}, r"id_space.cate: 'nope' is not an ID column of the data"),
    ({"cate": "hist_cate"}, r"data.columns.id_space.cate: expected a list, got str"),
])
def test_a_bad_id_space_is_a_config_error_naming_the_key(din_csv, id_space, message):
    raw = copy.deepcopy(DIN_RUN)
    raw["data"]["path"] = str(din_csv[0])
    raw["data"]["columns"]["id_space"] = id_space
    with pytest.raises(ConfigError, match=message):
        model_inputs(config_from_mapping(raw))


def test_columns_of_different_types_cannot_share_ids(din_csv, tmp_path):
    text = din_csv[0].read_text().splitlines()
    path = tmp_path / "typed.csv"
    path.write_text("\n".join([text[0]] + [",".join([*r.split(",")[:3], "b" + r.split(",")[3]])
                                           for r in text[1:]]) + "\n")
    with pytest.raises(ConfigError, match=r"id_space.cate: its columns hold different types "
                                          r"\(cate: int, brand: string\)"):
        _reader(path, id_space={"cate": ["brand"]})
