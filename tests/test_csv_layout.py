"""The layout of a text table from config alone (issue 33, items 2b, 2c and 7): the delimiter
sniffed (tab, ``;``, space, comma, ``|``) in every text reader unless ``data.csv.delimiter``
sets it, ``header: none`` with ``names``, a header-less file named as such, an empty file
named with exit code 3, and a feature no table reads said at start-up."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from cosparse.cli import main as cli_main
from cosparse.config import ConfigError, config_from_mapping
from cosparse.data.errors import DataError
from cosparse.features.csv_dialect import NAME_OF
from cosparse.train.data_notes import data_notes, delimiter_notes
from cosparse.train.inputs import model_inputs
from cosparse.train.trainer import Trainer

COLUMNS = ["id", "click", "site", "price"]
ROWS = [[str(i), str(i % 2), f"s{i % 7}", f"{i * 0.5}"] for i in range(40)]
RUN = {
    "data": {"reader": "csv", "batch_size": 16, "eval_fraction": 0.25,
             "columns": {"label": "click", "drop": ["id"], "dense": ["price"]}},
    "model": {"kind": "dlrm", "bottom": [4], "top": [4, 1]},
    "tables": [{"name": "t", "dim": 4, "features": "auto"}],
    "train": {"steps": 1, "progress": False},
}


def _write(path: Path, delimiter: str = ",", header: bool = True,
           rows: list[list[str]] = ROWS) -> Path:
    lines = ([COLUMNS] if header else []) + rows
    path.write_text("".join(delimiter.join(r) + "\n" for r in lines))
    return path


def _config(path: Path, **data):
    raw = copy.deepcopy(RUN)
    raw["data"].update(path=str(path), **data)
    return config_from_mapping(raw)


@pytest.mark.parametrize("delimiter", ["\t", ";", " ", ",", "|"])
def test_the_delimiter_is_sniffed_and_said_at_start_up(tmp_path, delimiter):
    path = _write(tmp_path / "x.csv", delimiter)  # a .csv name whatever the delimiter
    cfg = _config(path)
    inputs = model_inputs(cfg)
    assert inputs.train.keys == ["site"] and inputs.train.dense_keys == ["price"]
    b = inputs.train.build(next(inputs.train.tasks()))
    assert b.labels[:4].tolist() == [0, 1, 0, 1] and b.dense[:3, 0].tolist() == [0, 0.5, 1]
    (note,) = data_notes(inputs.cfg, inputs.train)
    assert note.startswith(f"data.csv.delimiter: {NAME_OF[delimiter]} ({delimiter!r}), "
                           f"sniffed from the first lines of {path}")


def test_commas_in_values_do_not_beat_the_delimiter_and_an_explicit_delimiter_wins(tmp_path):
    rows = [[r[0], r[1], r[2], r[3].replace(".", ",")] for r in ROWS]  # "0,5": a comma a row
    path = _write(tmp_path / "eu.csv", ";", rows=rows)
    inputs = model_inputs(_config(path, columns={"label": "click", "drop": ["id"]}))
    assert inputs.train.keys == ["site", "price"]  # price is text ("0,5"): an ID column
    # the same file with the comma set: line 1 has no comma, so one column, and no label
    with pytest.raises(DataError, match=r"eu\.csv: no label column 'click' \(columns: "
                                        r"id;click;site;price"):
        model_inputs(_config(path, csv={"delimiter": ","}))
    assert delimiter_notes(_config(path, csv={"delimiter": ";"}).data) == []
    # a comma in a text column of every row of a TSV (csv.Sniffer takes the comma there)
    tsv = _write(tmp_path / "t.csv", "\t", rows=[r[:2] + [f"{r[2]},x"] + r[3:] for r in ROWS])
    assert model_inputs(_config(tsv)).train.keys == ["site"]


def test_interactions_and_describe_sniff_too(tmp_path, capsys):
    log = tmp_path / "log.csv"
    log.write_text("uid\tiid\tts\n" + "".join(f"u{i % 3}\ti{i % 5}\t{i}\n" for i in range(30)))
    raw = {"data": {"reader": "interactions", "path": str(log), "batch_size": 8,
                    "events": {"max_len": 3, "shuffle": False},
                    "columns": {"user": "uid", "item": "iid", "time": "ts"},
                    "split": {"by": "last_per_user"}},
           "model": {"kind": "dlrm", "bottom": [4], "top": [4, 1]},
           "tables": [{"name": "t", "dim": 4, "features": ["user", "item", "hist_item"]}],
           "train": {"steps": 1, "progress": False}}
    inputs = model_inputs(config_from_mapping(raw))
    assert inputs.train.keys[:2] == ["user", "item"]
    b = inputs.train.build(next(iter(inputs.train.tasks())))
    assert len(b.labels) == 8  # 30 events of 3 users, each user's first has no history
    path = _write(tmp_path / "d.csv", "\t")
    assert cli_main(["data", "describe", str(path), "--no-progress"]) == 0
    out = capsys.readouterr()
    assert f"{path}: 40 rows, 4 columns" in out.out and "label: click" in out.out
    assert "data.csv.delimiter: tab" in out.err


@pytest.mark.parametrize("header", ["none", False])
def test_header_none_names_the_columns(tmp_path, header, capsys):
    path = _write(tmp_path / "nohead.csv", "\t", header=False)
    inputs = model_inputs(_config(path, csv={"header": header, "names": COLUMNS}))
    b = inputs.train.build(next(inputs.train.tasks()))
    assert inputs.train.keys == ["site"] and b.labels[:4].tolist() == [0, 1, 0, 1]
    assert inputs.train.source.num_rows == 30  # (all 40 lines are rows; 0.25 evaluate)
    conf = tmp_path / "c.yaml"
    raw = copy.deepcopy(RUN)
    raw["data"].update(path=str(path), csv={"header": header, "names": COLUMNS})
    conf.write_text(yaml.safe_dump(raw))
    assert cli_main(["data", "describe", str(path), "--config", str(conf),
                     "--no-progress"]) == 0
    assert f"{path}: 40 rows, 4 columns" in capsys.readouterr().out


def test_names_of_the_wrong_length_or_with_a_header_are_errors(tmp_path):
    path = _write(tmp_path / "nohead.csv", header=False)
    with pytest.raises(DataError, match=r"nohead\.csv: 4 columns on line 1, but "
                                        r"data\.csv\.names names 3"):
        model_inputs(_config(path, csv={"header": "none", "names": COLUMNS[:3]}))
    with pytest.raises(ConfigError, match=r"data\.csv\.names: .*data\.csv\.header: none"):
        _config(path, csv={"names": COLUMNS})
    with pytest.raises(ConfigError, match=r"data\.csv\.header"):
        _config(path, csv={"header": "nope"})


@pytest.mark.parametrize("first, why", [
    (["7", "1", "s1", "s1"], "('s1' repeated)"),
    (["7", "1", "1", "3.5"], "('1' repeated)"),
    (["7", "0", "3", "0.5"], "(every name is a number: 7, 0, 3, 0.5)"),
])
def test_a_headerless_file_says_so_and_exits_3(tmp_path, capsys, first, why):
    path = _write(tmp_path / "nohead.csv", header=False, rows=[first] + ROWS[1:])
    assert cli_main(["data", "describe", str(path), "--no-progress"]) == 3
    err = capsys.readouterr().err
    assert f"{path}: line 1 seems to be data, not a header {why}; if the file has no header, " \
        "set data.csv.header: none and name its 4 columns with data.csv.names" in err, err
    assert "on_bad_record" not in err


@pytest.mark.parametrize("text, message", [
    ("", "the file is empty"),
    (",".join(COLUMNS) + "\n", "a header line and no rows"),
])
def test_an_empty_file_exits_3_naming_it(tmp_path, capsys, text, message):
    path = tmp_path / "empty.csv"
    path.write_text(text)
    conf = tmp_path / "run.yaml"
    raw = copy.deepcopy(RUN)
    raw["data"]["path"] = str(path)
    conf.write_text(yaml.safe_dump(raw))
    assert cli_main(["data", "describe", str(path), "--no-progress"]) == 3
    assert cli_main(["data", "baseline", "--config", str(conf)]) == 3
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(f"cosparse: data error: {path}: {message}" in e for e in err)
    assert "on_bad_record" not in err[0]


def test_a_feature_no_table_reads_is_said_at_start_up(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("click,site,hour,device\n" +
                    "".join(f"{i % 2},s{i % 3},h{i % 5},d{i % 2}\n" for i in range(40)))
    raw = copy.deepcopy(RUN)
    raw["data"].update(path=str(path), columns={"label": "click"})
    raw["tables"] = [{"name": "t", "dim": 4, "features": ["site"]}]
    lines: list[str] = []
    t = Trainer(config_from_mapping(raw), log=lines.append)
    t.close()
    dropped = [ln for ln in lines if "no table reads" in ln]
    assert dropped == ["tables: no table reads hour, device of data.reader 'csv', so they are "
                       "dropped (name them in a table's features, or set a table's features: "
                       "auto)"], lines
    inputs = model_inputs(_config(path, columns={"label": "click"}))  # features: auto
    assert inputs.train.keys == ["site", "hour", "device"]
    assert not [n for n in data_notes(inputs.cfg, inputs.train) if "no table reads" in n]
