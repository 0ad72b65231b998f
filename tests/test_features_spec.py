"""Feature specs: versions propagate downstream only, diff and lineage, registry pins, and clear
FeatureSpecErrors for bad specs (unknown transform / parameter / input, cycles, type mismatches)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from cosparse.cli import main
from cosparse.features import (
    FeatureSpecError,
    diff,
    format_diff,
    format_lineage,
    lineage,
    load_spec,
    parse_spec,
)

SPEC = {
    "raw": {"I1": "int", "C1": "int", "C2": "int", "S": "string"},
    "features": [
        {"name": "i1_log", "inputs": ["I1"], "kind": "dense",
         "transforms": [{"fill_missing": {"value": 0}}, {"clip": {"min": 0}}, {"log1p": {}}]},
        {"name": "c1", "inputs": ["C1"], "transforms": [{"hash": {"seed": 11, "buckets": 1000003}}],
         "kind": "sparse", "table": "cat"},
        {"name": "c2", "inputs": ["C2"], "transforms": [{"hash": {"seed": 11, "buckets": 1000003}}],
         "kind": "sparse", "table": "cat"},
        {"name": "c1_x_c2", "inputs": ["c1", "c2"], "transforms": [{"cross": {"seed": 7}}],
         "kind": "sparse", "table": "cross"},
        {"name": "x_x_c2", "inputs": ["c1_x_c2", "c2"], "transforms": [{"cross": {"seed": 8}}],
         "kind": "sparse", "table": "cross"},
        {"name": "i1_bucket", "inputs": ["I1"], "kind": "sparse", "table": "bucket",
         "transforms": [{"bucketize": {"boundaries": [0, 1, 10, 100]}}]},
    ],
    "models": [
        {"name": "dlrm_v1", "consumes": ["i1_log", "c1", "c1_x_c2"]},
        {"name": "deepfm_v1", "consumes": ["c2", "i1_bucket"]},
    ],
}


def spec(**edits) -> dict:
    d = copy.deepcopy(SPEC)
    for name, tr in edits.items():
        next(f for f in d["features"] if f["name"] == name)["transforms"] = tr
    return d


def err(d: dict, match: str) -> None:
    with pytest.raises(FeatureSpecError, match=match):
        parse_spec(d)


def test_changed_transform_changes_its_version_and_downstream_only() -> None:
    a = parse_spec(spec())
    b = parse_spec(spec(c1=[{"hash": {"seed": 12, "buckets": 1000003}}]), check_pins=False)
    changed = {n for n in a.versions if a.versions[n] != b.versions[n]}
    assert changed == {"c1", "c1_x_c2", "x_x_c2"}
    assert all(len(v) == 12 for v in a.versions.values())
    # a param order or a default spelled out does not change the version
    c = parse_spec(spec(c1=[{"hash": {"buckets": 1000003, "seed": 11}}]))
    assert c.versions == a.versions
    d = diff(a, b)
    assert d["added"] == [] and d["removed"] == []
    by = {c["name"]: c for c in d["changed"]}
    assert by["c1"]["cause"] == "spec" and "seed" in by["c1"]["details"][0]
    assert by["c1_x_c2"]["cause"] == "upstream" and by["c1_x_c2"]["details"] == ["c1"]
    assert by["x_x_c2"]["cause"] == "upstream" and by["x_x_c2"]["details"] == ["c1_x_c2"]
    assert set(d["models"]) == {"dlrm_v1"} and d["models"]["dlrm_v1"]["features"] == ["c1", "c1_x_c2"]
    text = format_diff(a, b)
    assert "~ c1 " in text and "downstream of a change: input c1 changed" in text
    assert "dlrm_v1: consumes changed/removed c1, c1_x_c2" in text and "deepfm_v1" not in text


def test_diff_added_removed() -> None:
    a = parse_spec(spec())
    d2 = spec()
    d2["features"] = [f for f in d2["features"] if f["name"] != "i1_bucket"]
    d2["features"].append({"name": "c2b", "inputs": ["C2"], "transforms": [{"hash": {}}], "kind": "sparse"})
    d2["models"][1]["consumes"] = ["c2"]
    b = parse_spec(d2)
    d = diff(a, b)
    assert d["added"] == ["c2b"] and d["removed"] == ["i1_bucket"] and d["changed"] == []
    assert d["models"]["deepfm_v1"]["status"] == "changed"


def test_lineage_lists_dag_and_consumers() -> None:
    fs = parse_spec(spec())
    lin = lineage(fs)
    names = [f["name"] for f in lin["features"]]
    assert names.index("c1") < names.index("c1_x_c2") < names.index("x_x_c2")
    c1 = next(f for f in lin["features"] if f["name"] == "c1")
    assert c1["downstream"] == ["c1_x_c2"] and c1["consumers"] == ["dlrm_v1"] and c1["table"] == "cat"
    assert c1["inputs"] == [{"name": "C1", "version": fs.raw_version("C1"), "raw": True}]
    dl = next(m for m in lin["models"] if m["name"] == "dlrm_v1")
    assert [(r["name"], r["version"]) for r in dl["features"]] == \
        [(n, fs.versions[n]) for n in ("i1_log", "c1", "c1_x_c2")]
    text = format_lineage(fs)
    assert f"c1@{fs.versions['c1']}  sparse table=cat" in text
    assert f"dlrm_v1: i1_log@{fs.versions['i1_log']}" in text


def test_registry_pins() -> None:
    fs = parse_spec(spec())
    v = fs.versions["c1_x_c2"]
    d = spec()
    d["models"][0]["consumes"] = ["i1_log", "c1", f"c1_x_c2@{v}"]
    ok = parse_spec(d)
    assert [f.name for f in ok.consumer("dlrm_v1")] == ["i1_log", "c1", "c1_x_c2"]
    assert ok.consumer_keys("dlrm_v1") == (["c1", "c1_x_c2"], ["i1_log"])
    d["features"][1]["transforms"] = [{"hash": {"seed": 99}}]  # c1 changes -> c1_x_c2 changes
    with pytest.raises(FeatureSpecError, match=rf"model 'dlrm_v1': feature 'c1_x_c2' is pinned to "
                                               rf"version {v} but the spec now produces [0-9a-f]{{12}}"):
        parse_spec(d)
    stale = parse_spec(d, check_pins=False)
    assert stale.stale_pins()["dlrm_v1"][0][:2] == ("c1_x_c2", v)
    with pytest.raises(FeatureSpecError, match="unknown model 'nope'"):
        ok.consumer("nope")
    d = spec()
    d["models"][0]["consumes"] = ["c9"]
    err(d, "model 'dlrm_v1': consumes unknown feature 'c9'")


def test_bad_specs_are_clear_errors() -> None:
    err(spec(c1=[{"hsh": {}}]), r"feature 'c1': transforms\[0\]: unknown transform 'hsh'")
    err(spec(c1=[{"hash": {"sed": 1}}]), r"feature 'c1': transforms\[0\]\.hash: unknown parameter 'sed'")
    err(spec(c1=[{"hash": {"buckets": "x"}}]), r"transforms\[0\]\.hash\.buckets: must be int")
    err(spec(i1_bucket=[{"bucketize": {"boundaries": [3, 1]}}]), "strictly increasing")
    d = spec()
    d["features"][1]["inputs"] = ["C9"]
    err(d, r"feature 'c1'\.inputs: unknown input 'C9': not a feature and not a column")
    d = spec()
    d["features"][1]["inputs"] = ["x_x_c2"]
    err(d, r"feature 'c1': inputs form a cycle: c1 -> x_x_c2 -> c1_x_c2 -> c1")
    err({"features": [{"name": "a", "inputs": ["a"], "kind": "sparse"}]}, "cycle: a -> a")
    # type mismatches
    d = spec()
    d["features"].append({"name": "s_log", "inputs": ["S"], "transforms": [{"log1p": {}}], "kind": "dense"})
    err(d, r"feature 's_log': transforms\[0\]\.log1p: needs a numeric column, got string")
    d = spec()
    d["features"][1]["kind"] = "dense"
    d["features"][1].pop("table")
    err(d, r"feature 'c1'\.kind: declared dense but its values are IDs")
    d = spec()
    d["features"].append({"name": "t", "inputs": ["C1"], "transforms": [{"truncate": {"max_len": 3}}],
                          "kind": "sequence"})
    err(d, r"feature 't': transforms\[0\]\.truncate: .*needs a list column, got int")
    d = spec()
    d["features"].append({"name": "h", "inputs": ["C1", "C2", "I1"],
                          "transforms": [{"history": {"window_s": 10}}], "kind": "sequence"})
    err(d, r"feature 'h': transforms\[0\]\.history: needs a jagged values column as input 0, got int")
    d = spec()
    d["features"].append({"name": "s", "inputs": ["S"], "kind": "sparse"})
    err(d, r"feature 's'\.kind: declared sparse but its values are string \(hash or vocab it first\)")
    d = spec()
    d["features"][0]["kind"] = "sequence"
    err(d, r"feature 'i1_log'\.kind: declared sequence")
    err({"features": [{"name": "a", "inputs": ["x"], "kind": "sparse", "tabel": "t"}]},
        "feature 'a': unknown key 'tabel'")
    err({"featurs": []}, "unknown key 'featurs'")


def test_check_source_without_declared_raw() -> None:
    d = spec()
    d.pop("raw")
    fs = parse_spec(d)  # types unknown until a source is given
    with pytest.raises(FeatureSpecError, match=r"unknown input 'S'|unknown input 'I1'"):
        fs.check_source({"C1": "int", "C2": "int"})
    with pytest.raises(FeatureSpecError,
                       match=r"feature 'i1_log': transforms\[0\]\.fill_missing: .*got string"):
        fs.check_source({"C1": "int", "C2": "int", "I1": "string"})
    types = fs.check_source({"C1": "int", "C2": "int", "I1": "int"})
    assert types["i1_log"].kind == "float" and types["c1_x_c2"].categorical
    fs2 = parse_spec(spec())
    with pytest.raises(FeatureSpecError, match="raw.I1: declared int but the source has float"):
        fs2.check_source({"C1": "int", "C2": "int", "I1": "float", "S": "string"})


def test_cli_lineage_and_diff(tmp_path: Path, capsys) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(yaml.safe_dump(spec()))
    b.write_text(yaml.safe_dump(spec(c1=[{"hash": {"seed": 12}}])))
    assert main(["features", "lineage", "--spec", str(a)]) == 0
    out = capsys.readouterr().out
    assert "consumed by: dlrm_v1" in out and "models (2):" in out
    assert main(["features", "diff", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "~ c1 " in out and "(downstream of a change: input c1 changed)" in out and "dlrm_v1" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(spec(c1=[{"hsh": {}}])))
    assert main(["features", "lineage", "--spec", str(bad)]) == 2
    assert "unknown transform 'hsh'" in capsys.readouterr().err


def test_shipped_criteo_spec_loads() -> None:
    fs = load_spec(Path(__file__).resolve().parents[1] / "configs/features/criteo.yaml")
    dl, dfm = fs.consumer_keys("dlrm_v1"), fs.consumer_keys("deepfm_v1")
    assert len(dl[1]) == 13 and len(dfm[1]) == 0
    assert set(dl[0]) & set(dfm[0])  # overlapping consumers
    assert {fs[n].table for n in dfm[0]} == {"cat", "bucket", "cross"}
