"""``cosparse data describe``: each column's type, distinct values (a sketch, exact while
small), null share and range, the label's balance, and a data.columns block that trains."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from cosparse.cli import main as cli_main
from cosparse.config import config_from_mapping
from cosparse.features.describe import DistinctSketch
from cosparse.train.inputs import model_inputs

AVAZU = Path(__file__).resolve().parents[2] / "shared/data/avazu/train_head9k.csv"


def test_the_sketch_is_exact_while_small_and_close_when_large():
    rng = np.random.default_rng(0)
    s = DistinctSketch(k=256)
    s.update(rng.integers(0, 2**63 - 1, 200, dtype=np.int64).repeat(3))
    assert s.estimate() == 200
    big = DistinctSketch(k=4096)
    for chunk in np.array_split(rng.integers(0, 2**63 - 1, 200_000, dtype=np.int64), 7):
        big.update(chunk)
    assert abs(big.estimate() / 200_000 - 1) < 0.05


def test_describe_a_csv_log_prints_columns_label_and_a_block_that_trains(tmp_path, capsys):
    if not AVAZU.is_file():
        pytest.skip(f"{AVAZU} not present")
    assert cli_main(["data", "describe", str(AVAZU), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "8,999 rows, 24 columns" in out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert lines["id"][1] == "uint64" and lines["site_id"][1] == "string"
    assert lines["C1"][1] == "int64" and lines["id"][2].startswith("~")  # (past the sketch)
    assert lines["banner_pos"][3] == "0.0%"
    clicks = sum(int(line.split(",")[1]) for line in AVAZU.read_text().splitlines()[1:])
    assert f"label: click, {clicks / 8999:.1%} positive ({clicks:,} of 8,999)" in out
    block = yaml.safe_load(out[out.index("data:\n"):])
    assert block["data"]["columns"] == {
        "label": "click", "drop": ["id"], "sparse": "auto",
        "datetime": {"hour": {"format": "%y%m%d%H", "emit": ["hour_of_day", "day_of_week"]}}}
    raw = {"data": {"reader": "csv", "path": str(AVAZU), "batch_size": 512,
                    **block["data"]},
           "model": {"kind": "dlrm", "bottom": [8], "top": [8, 1]},
           "tables": [{"name": "t", "dim": 8, "features": "auto"}],
           "train": {"steps": 3, "log_every": 1, "progress": False}}
    inputs = model_inputs(config_from_mapping(raw))  # the block as it is: a config that reads
    assert "hour_hour_of_day" in inputs.train.keys and "id" not in inputs.train.keys


def test_describe_parquet_nulls_floats_and_no_label(tmp_path, capsys):
    pq.write_table(pa.table({"price": pa.array([0.5, None, 2.0, 4.0]),
                             "site": pa.array(["a", "b", None, "a"])}), tmp_path / "x.parquet")
    assert cli_main(["data", "describe", str(tmp_path / "x.parquet"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    price = next(line.split() for line in out.splitlines() if line.startswith("price"))
    assert price[1:4] == ["float32", "3", "25.0%"] and price[4:] == ["0.5", "..", "4"]
    site = next(line.split() for line in out.splitlines() if line.startswith("site"))
    assert site[1:4] == ["string", "2", "25.0%"]
    assert "label: no 0/1 column found (set data.columns.label)" in out
    assert "dense: [price]" in out
