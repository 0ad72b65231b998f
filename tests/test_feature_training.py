"""Training from the feature platform: a registry consumer trains like the reader it replaces,
from features extracted on the fly or read back from a materialization (never a stale one)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from cosparse.cli import main
from cosparse.config import ConfigError, config_from_mapping
from cosparse.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
CRITEO = ROOT.parent / "shared/data/criteo/train_head10k.txt"
PLAIN_SPEC = ROOT / "configs/features/criteo_plain.yaml"
pytestmark = pytest.mark.skipif(not CRITEO.exists(), reason="../shared/data/criteo is not present")


def raw_config(features: dict | None, steps: int = 8) -> dict:
    table = {"name": "cat", "dim": 8, "optimizer": {"kind": "rowwise_adagrad", "lr": 0.05}}
    if features is None:
        table["features"] = [f"C{k}" for k in range(1, 27)]
    raw = {"data": {"reader": "criteo_tsv", "path": str(CRITEO), "batch_size": 512,
                    "eval_fraction": 0.2},
           "model": {"kind": "dlrm", "bottom": [16, 8], "top": [16, 1]},
           "tables": [table],
           "store": {"device": {"rows": 12000}}, "supply": {"lookahead": 2},
           "train": {"steps": steps, "progress": False, "log_every": 4, "threads": 2}}
    if features is not None:
        raw["features"] = features
    return raw


def train(raw: dict) -> Trainer:
    t = Trainer(config_from_mapping(raw), log=lambda m: None)
    try:
        t.final = t.run()
    finally:
        t.close()
    return t


def test_the_readers_own_features_as_a_spec_train_bit_identically():
    """Step 0 of the migration: the same model, fed by the feature platform."""
    plain = train(raw_config(None))
    spec = train(raw_config({"spec": str(PLAIN_SPEC), "consumer": "criteo_plain"}))
    assert spec.losses == plain.losses
    assert spec.final["auc"] == plain.final["auc"]
    assert spec.features_computed == 8 * 39 and plain.features_computed == 0


def test_materialized_features_train_like_extracted_ones_and_a_stale_one_is_refused(tmp_path):
    from cosparse.features import CriteoRawSource, load_spec, materialize

    spec = tmp_path / "spec.yaml"
    doc = yaml.safe_load(PLAIN_SPEC.read_text())
    doc["features"].append({"name": "c1_x_c2", "inputs": ["c1", "c2"], "kind": "sparse",
                            "table": "cat", "transforms": [{"cross": {"seed": 7}}]})
    doc["models"][0]["consumes"].append("c1_x_c2")
    spec.write_text(yaml.safe_dump(doc))
    fs = load_spec(spec)
    out = tmp_path / "mat"
    materialize(CriteoRawSource(str(CRITEO), 2048, "train", 0.0), fs, out, progress_every=0)
    features = {"spec": str(spec), "consumer": "criteo_plain"}
    live = train(raw_config(features))
    read_back = train(raw_config({**features, "materialized": str(out)}))
    assert read_back.losses == live.losses
    assert read_back.final["auc"] == live.final["auc"]
    assert read_back.features_computed == 0 < live.features_computed  # nothing recomputed

    # other raw data than the materialization's, or the same file changed since: refused
    other = raw_config({**features, "materialized": str(out)})
    other["data"]["path"] = str(ROOT.parent / "shared/data/criteo/test_head10k_unlabeled.txt")
    with pytest.raises(ConfigError, match="was made from"):
        Trainer(config_from_mapping(other))
    copy = tmp_path / "train.txt"
    shutil.copyfile(CRITEO, copy)
    materialize(CriteoRawSource(str(copy), 2048, "train", 0.0), fs, tmp_path / "mat2",
                progress_every=0)
    edited = raw_config({**features, "materialized": str(tmp_path / "mat2")})
    edited["data"]["path"] = str(copy)
    Trainer(config_from_mapping(edited)).close()  # as materialized: accepted
    with open(copy, "a") as f:
        f.write(CRITEO.read_text().splitlines()[0] + "\n")
    with pytest.raises(ConfigError, match="stale: .* changed since"):
        Trainer(config_from_mapping(edited))

    doc["features"][-1]["transforms"][0]["cross"]["seed"] = 8  # the cross changed
    spec.write_text(yaml.safe_dump(doc))
    new_version = load_spec(spec).versions["c1_x_c2"]
    with pytest.raises(ConfigError, match=f"c1_x_c2.*{new_version}|{new_version}.*c1_x_c2"):
        Trainer(config_from_mapping(raw_config({**features, "materialized": str(out)})))


def test_a_consumer_of_an_unknown_model_or_feature_fails_at_start_up(tmp_path):
    with pytest.raises(ConfigError, match="features.consumer.*nobody"):
        Trainer(config_from_mapping(raw_config({"spec": str(PLAIN_SPEC), "consumer": "nobody"})))
    raw = raw_config({"spec": str(PLAIN_SPEC), "consumer": "criteo_plain"})
    raw["tables"][0]["features"] = ["c1", "C2"]
    with pytest.raises(ConfigError, match=r"tables\[0\].features: 'C2'"):
        Trainer(config_from_mapping(raw))
    bad = tmp_path / "cyclic.yaml"
    bad.write_text(yaml.safe_dump({"features": [
        {"name": "a", "inputs": ["b"], "kind": "sparse", "table": "cat",
         "transforms": [{"hash": {"seed": 1}}]},
        {"name": "b", "inputs": ["a"], "kind": "sparse", "table": "cat",
         "transforms": [{"hash": {"seed": 1}}]}], "models": [{"name": "m", "consumes": ["a"]}]}))
    with pytest.raises(ConfigError, match="features.spec.*cycl"):
        Trainer(config_from_mapping(raw_config({"spec": str(bad), "consumer": "m"})))
    doc = yaml.safe_load(PLAIN_SPEC.read_text())  # quantile buckets must be fitted first
    doc["features"].append({"name": "i1_q", "inputs": ["I1"], "kind": "sparse", "table": "cat",
                            "transforms": [{"bucketize": {"quantiles": 8}}]})
    doc["models"][0]["consumes"].append("i1_q")
    unfitted = tmp_path / "unfitted.yaml"
    unfitted.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="i1_q' buckets by quantiles that are not fitted.*"
                                          "cosparse features fit"):
        Trainer(config_from_mapping(raw_config({"spec": str(unfitted),
                                                "consumer": "criteo_plain"})))


def test_cosparse_train_runs_several_models_from_one_extraction(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)  # the config's paths are relative to the repository
    rc = main(["train", "--config", "configs/criteo_multi.yaml", "--steps", "6", "--no-progress",
               "--metrics-json", str(tmp_path / "m.jsonl")])
    assert rc == 0
    final = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["final"]
    assert set(final["models"]) == {"dlrm_v1", "deepfm_v1"}
    f = final["features"]
    assert f["computed"] == f["batches"] * f["extracted"]  # once per batch the stream built
    assert 6 * 73 <= f["served"] <= f["batches"] * 73  # (it reads ahead of the models)
    assert (tmp_path / "m.dlrm_v1.jsonl").exists() and (tmp_path / "m.deepfm_v1.jsonl").exists()


def test_migration_step_0_compares_the_reader_with_the_platform(tmp_path, monkeypatch):
    """docs/migration.md step 0: `cosparse compare --config-b` on the two Criteo configs."""
    from cosparse.report.compare import compare

    monkeypatch.chdir(ROOT)
    result = compare("configs/criteo_ab.yaml", "arch-a", "arch-a", 6, tmp_path / "cmp",
                     warmup=1, log=lambda m: None, config_b="configs/criteo_ab_features.yaml")
    assert result["loss_identical"] is True
    assert result["config_b"] == "configs/criteo_ab_features.yaml"
    assert "config of b" in (tmp_path / "cmp/report.html").read_text()
