"""Several models from one feature extraction: each common feature is computed once per batch,
every model gets its own view, and each trains exactly as it would alone."""

from __future__ import annotations

import copy
import dataclasses
import os
import socket
from pathlib import Path

import numpy as np
import pytest
import yaml

from cosparse.config import ConfigError, config_from_mapping
from cosparse.train.multi import MultiTrainer
from cosparse.train.trainer import Trainer

CRITEO = Path(__file__).resolve().parents[2] / "shared/data/criteo/train_head10k.txt"
pytestmark = pytest.mark.skipif(not CRITEO.exists(), reason="../shared/data/criteo is not present")

DENSE = [f"i{k}" for k in range(1, 14)]
CATS = [f"c{k}" for k in range(1, 9)]


def write_spec(path: Path, cross_seed: int = 7) -> Path:
    feats = [{"name": f"i{k}", "inputs": [f"I{k}"], "kind": "dense",
              "transforms": [{"fill_missing": {"value": 0}}, {"clip": {"min": 0}}, {"log1p": {}}]}
             for k in range(1, 14)]
    feats += [{"name": f"c{k}", "inputs": [f"C{k}"], "kind": "sparse", "table": "cat",
               "transforms": [{"hash": {"seed": 11, "buckets": 100_003}}]} for k in range(1, 9)]
    feats += [
        {"name": "c1_x_c2", "inputs": ["c1", "c2"], "kind": "sparse", "table": "cross",
         "transforms": [{"cross": {"seed": cross_seed}}]},
        {"name": "i1_bucket", "inputs": ["I1"], "kind": "sparse", "table": "bucket",
         "transforms": [{"bucketize": {"boundaries": [0, 1, 3, 10, 30, 100]}}]},
    ]
    models = [{"name": "dlrm_v1", "consumes": [*DENSE, *CATS, "c1_x_c2"]},
              {"name": "deepfm_v1", "consumes": [*DENSE[:4], *CATS[:6], "i1_bucket"]}]
    path.write_text(yaml.safe_dump({"features": feats, "models": models}))
    return path


def table(name: str) -> dict:
    return {"name": name, "dim": 8, "optimizer": {"kind": "rowwise_adagrad", "lr": 0.05}}


def multi_raw(spec: Path, workers: int = 1, steps: int = 16) -> dict:
    return {
        "data": {"reader": "criteo_tsv", "path": str(CRITEO), "batch_size": 512,
                 "workers": workers, "eval_fraction": 0.2},
        "features": {"spec": str(spec)},
        "models": [
            {"name": "dlrm_v1", "model": {"kind": "dlrm", "bottom": [16, 8], "top": [16, 1]},
             "tables": [table("cat"), table("cross")]},
            {"name": "deepfm_v1", "model": {"kind": "deepfm", "deep": [16, 8]},
             "tables": [table("cat"), table("bucket")]},
        ],
        "train": {"steps": steps, "progress": False, "log_every": 6, "threads": 2},
    }


def single_raw(multi: dict, i: int) -> dict:
    raw = copy.deepcopy(multi)
    entry = raw.pop("models")[i]
    raw["model"], raw["tables"] = entry["model"], entry["tables"]
    raw["features"]["consumer"] = entry["name"]
    return raw


def test_each_common_feature_is_computed_once_per_batch_and_models_train_as_alone(tmp_path):
    spec = write_spec(tmp_path / "spec.yaml")
    raw = multi_raw(spec)
    multi = MultiTrainer(config_from_mapping(raw), log=lambda m: None)
    try:
        out = multi.run()
    finally:
        multi.close()
    pids = multi.fanout.worker_pids
    f = out["features"]
    union = 13 + 8 + 2  # i1..i13, c1..c8, the cross and the bucket: the closure of both models
    served = (13 + 8 + 1) + (4 + 6 + 1)
    assert f["batches"] == 16  # one epoch of the 8,000 training rows
    assert f["computed"] == 16 * union  # every feature of the union once per batch
    assert f["served"] == 16 * served  # and handed to both models: the overlap is not recomputed
    assert f["computed"] < f["served"]
    # the shared link carried each batch once, however many models trained on it
    assert out["bytes.worker_trainer"] == multi.trainers["dlrm_v1"].wire_bytes > 0
    assert pids and os.getpid() not in pids  # extraction ran in the data-worker process
    for name in ("dlrm_v1", "deepfm_v1"):  # and each model's featurize stage shows its time
        assert out["models"][name]["stage_ms.featurize"] > 0, name
    for p in pids:  # and that process is gone
        with pytest.raises(ProcessLookupError):
            os.kill(p, 0)
    for i, name in enumerate(("dlrm_v1", "deepfm_v1")):
        alone = Trainer(config_from_mapping(single_raw(raw, i)), log=lambda m: None)
        try:
            alone_final = alone.run()
            assert alone.losses == multi.trainers[name].losses, name
            assert alone_final["auc"] == out["models"][name]["auc"]
            assert alone.features_computed == 16 * (22 if i == 0 else 11)
        finally:
            alone.close()
        assert 0.5 < out["models"][name]["auc"] < 1.0


def test_models_that_stop_mid_epoch_leave_the_shared_stream_idle(tmp_path):
    """Both models stop at step 4 of a 16-batch epoch and then evaluate: the shared stream builds
    no further than its queues (a closed model's stream is not a reader to fill)."""
    raw = multi_raw(write_spec(tmp_path / "spec.yaml"), steps=4)
    raw["data"]["queue_depth"] = 2
    multi = MultiTrainer(config_from_mapping(raw), log=lambda m: None)
    try:
        out = multi.run()
    finally:
        multi.close()
    assert all(t.state.step == 4 for t in multi.trainers.values())
    # 4 trained, the models' read-ahead (prefetch and planning), and the stream's own queue
    assert out["features"]["batches"] < 16


def test_multi_model_config_errors_name_the_key(tmp_path):
    spec = write_spec(tmp_path / "spec.yaml")
    raw = multi_raw(spec)
    bad = copy.deepcopy(raw)
    del bad["features"]
    with pytest.raises(ConfigError, match="features.spec"):
        config_from_mapping(bad)
    bad = copy.deepcopy(raw)
    bad["models"][1]["name"] = "dlrm_v1"
    with pytest.raises(ConfigError, match=r"models\[1\].name: model 'dlrm_v1' is declared twice"):
        config_from_mapping(bad)
    bad = copy.deepcopy(raw)
    bad["models"][0]["model"]["bottom"] = [16, 4]
    with pytest.raises(ConfigError, match=r"models\[0\].model.bottom"):
        config_from_mapping(bad)
    bad = copy.deepcopy(raw)
    bad["models"][0]["name"] = "nobody"
    with pytest.raises(ConfigError, match="nobody"):
        MultiTrainer(config_from_mapping(bad), log=lambda m: None)
    bad = copy.deepcopy(raw)
    bad["models"][0]["tables"] = [table("cat")]  # the cross feeds a table it does not declare
    with pytest.raises(ConfigError, match="c1_x_c2.*cross"):
        MultiTrainer(config_from_mapping(bad), log=lambda m: None)


def test_a_model_pinned_to_a_version_no_longer_produced_fails_at_start_up(tmp_path):
    from cosparse.features import load_spec

    old = load_spec(write_spec(tmp_path / "old.yaml"))
    version = old.versions["c1_x_c2"]
    spec = write_spec(tmp_path / "spec.yaml", cross_seed=8)  # the cross changed
    text = yaml.safe_load(spec.read_text())
    text["models"][0]["consumes"][-1] = f"c1_x_c2@{version}"
    spec.write_text(yaml.safe_dump(text))
    with pytest.raises(ConfigError, match=f"c1_x_c2.*{version}"):
        MultiTrainer(config_from_mapping(multi_raw(spec)), log=lambda m: None)


def test_a_failing_model_stops_the_others_and_the_shared_workers(tmp_path):
    raw = multi_raw(write_spec(tmp_path / "spec.yaml"), steps=10_000)
    raw["train"]["epochs"] = 3
    multi = MultiTrainer(config_from_mapping(raw), log=lambda m: None)
    failing = multi.trainers["deepfm_v1"]
    one_step = failing._one_step

    def boom(prepared, *args, **kwargs):
        if failing.state.step == 2:
            raise RuntimeError("boom")
        return one_step(prepared, *args, **kwargs)

    failing._one_step = boom
    try:
        with pytest.raises(RuntimeError, match="boom"):
            multi.run()
    finally:
        multi.close()
    other = multi.trainers["dlrm_v1"]
    assert other.state.epoch == 0 and other.state.step < 16  # stopped, not through its epochs
    assert len(multi.fanout._rounds) == 1  # and no new epoch started a new stream
    for p in multi.fanout.worker_pids:
        with pytest.raises(ProcessLookupError):
            os.kill(p, 0)


def test_with_isolate_models_a_failing_model_stops_alone_and_the_run_reports_it(tmp_path):
    raw = multi_raw(write_spec(tmp_path / "spec.yaml"))
    raw["train"]["isolate_models"] = True
    multi = MultiTrainer(config_from_mapping(raw), log=lambda m: None)
    failing = multi.trainers["deepfm_v1"]
    one_step = failing._one_step

    def boom(prepared, *args, **kwargs):
        if failing.state.step == 2:
            raise RuntimeError("boom")
        return one_step(prepared, *args, **kwargs)

    failing._one_step = boom
    try:
        out = multi.run()
    finally:
        multi.close()
    assert out["failed_models"] == {"deepfm_v1": "RuntimeError: boom"}
    assert failing.state.step == 2
    assert multi.trainers["dlrm_v1"].state.step == 16  # trained on through every batch
    assert 0.5 < out["models"]["dlrm_v1"]["auc"] < 1.0
    assert "deepfm_v1" not in out["models"]
    for p in multi.fanout.worker_pids:
        with pytest.raises(ProcessLookupError):
            os.kill(p, 0)


def test_isolate_models_and_namespace_config_refusals_name_the_key(tmp_path):
    raw = multi_raw(write_spec(tmp_path / "spec.yaml"))
    single = single_raw(raw, 0)
    single["train"]["isolate_models"] = True
    with pytest.raises(ConfigError, match=r"train.isolate_models: isolates the models of a "
                                          r"multi-model run"):
        config_from_mapping(single)
    raw["supply"] = {"path": "ps-direct"}
    raw["store"] = {"remote": {"namespace": "shared"}}
    with pytest.raises(ConfigError, match=r"store.remote.namespace: in a multi-model run each "
                                          r"model's tables live in a PS namespace named after it"):
        config_from_mapping(raw)
    raw["store"] = {}
    raw["models"][0]["name"] = "dlrm v1"
    with pytest.raises(ConfigError, match=r"models\[0\].name: 'dlrm v1' names the model's PS "
                                          r"namespace"):
        config_from_mapping(raw)


def test_ps_direct_models_on_one_ps_keep_their_same_named_tables_apart(tmp_path):
    """Architecture A: both models have a table 'cat' on the same external shards; each lands in
    its own namespace, and deepfm's rows there are exactly those it trains alone."""
    from cosparse.ps import EmbeddedShards

    raw = multi_raw(write_spec(tmp_path / "spec.yaml"), steps=8)
    raw["supply"] = {"path": "ps-direct"}
    with EmbeddedShards(2, [], tmp_path / "ps") as sh:
        raw["store"] = {"remote": {"embedded": False, "endpoints": list(sh.endpoints)}}
        multi = MultiTrainer(config_from_mapping(raw), log=lambda m: None)
        try:
            multi.run()
        finally:
            multi.close()
        with sh.client(timeout_s=20) as c:
            tables = set(c.stats()[0]["tables"])
            assert {"dlrm_v1/cat", "deepfm_v1/cat", "dlrm_v1/cross",
                    "deepfm_v1/bucket"} <= tables
            assert not any(t.startswith("default/") for t in tables)
            shared_ids, shared_rows = c.dump("deepfm_v1/cat")
            dlrm_ids, _ = c.dump("dlrm_v1/cat")
    assert not np.array_equal(np.sort(shared_ids), np.sort(dlrm_ids))  # c7, c8: dlrm's only
    alone_raw = single_raw(raw, 1)
    alone_raw["store"] = {"remote": {"num_shards": 2}}
    alone = Trainer(config_from_mapping(alone_raw), log=lambda m: None)
    try:
        alone.run()
        ids, rows = alone.path.ps.client.dump("cat")
    finally:
        alone.close()
    got = dict(zip(shared_ids.tolist(), range(len(shared_ids)), strict=True))
    assert sorted(got) == sorted(ids.tolist())
    np.testing.assert_array_equal(shared_rows[[got[i] for i in ids.tolist()]], rows)


def _free_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _collaborative(raw: dict, endpoints: list[str]) -> dict:
    """Architecture B over external shards: device and host tiers smaller than the tables, so
    the data workers bring each model's cold rows."""
    raw = copy.deepcopy(raw)
    raw["supply"] = {"path": "collaborative", "lookahead": 4, "fallback": "ps-direct"}
    raw["store"] = {"device": {"rows": 1500, "policy": "hotness"},
                    "host": {"rows": 3000, "spill": True, "spill_to": "remote"},
                    "remote": {"embedded": False, "endpoints": list(endpoints)}}
    return raw


def _cat_rows(t: Trainer) -> tuple[np.ndarray, np.ndarray]:
    """The rows of table 'cat' wherever they are now (tiers and PS)."""
    st = t.ec.export_rows()["cat"]
    return st["ids"], st["rows"]


def _alone_b(raw: dict, i: int, ps_dir: Path) -> tuple[list[float], np.ndarray, np.ndarray]:
    """Model ``i`` trained alone under B on its own embedded shards: its losses and the rows
    of its table 'cat'."""
    alone_raw = single_raw(raw, i)
    alone_raw["store"]["remote"] = {"num_shards": 2, "data_dir": str(ps_dir)}
    alone = Trainer(config_from_mapping(alone_raw), log=lambda m: None)
    try:
        alone.run(evaluate=False)
        assert alone.path.counters_b.delivered_rows > 0 and not alone.path.fallbacks
        return alone.losses, *_cat_rows(alone)
    finally:
        alone.close()


def _same_rows(got_ids, got_rows, ids, rows) -> None:
    at = dict(zip(got_ids.tolist(), range(len(got_ids)), strict=True))
    assert sorted(at) == sorted(ids.tolist())
    np.testing.assert_array_equal(got_rows[[at[i] for i in ids.tolist()]], rows)


def test_collaborative_models_bring_their_own_rows_from_one_extraction(tmp_path):
    """Architecture B with two models on one set of shards: one extraction per batch, each
    model's data-worker part brings its own cold rows (its filter, its namespace), and each
    trains exactly as alone: same losses, and its rows on the PS are its own."""
    from cosparse.ps import EmbeddedShards

    raw = multi_raw(write_spec(tmp_path / "spec.yaml"), steps=12)
    with EmbeddedShards(2, [], tmp_path / "ps") as sh:
        raw = _collaborative(raw, sh.endpoints)
        multi = MultiTrainer(config_from_mapping(raw), log=lambda m: None)
        try:  # a resident filter of its own each
            filters = {t.path.codec.layout.path for t in multi.trainers.values()}
            out = multi.run()
            got = {name: _cat_rows(t) for name, t in multi.trainers.items()}
        finally:
            multi.close()
        with sh.client(timeout_s=20) as c:
            tables = set(c.stats()[0]["tables"])
    assert {"dlrm_v1/cat", "dlrm_v1/cross", "deepfm_v1/cat", "deepfm_v1/bucket"} <= tables
    assert out["features"]["computed"] == out["features"]["batches"] * (13 + 8 + 2)
    workers = multi.fanout.worker_pids
    assert len(filters) == 2
    for name, t in multi.trainers.items():
        b = t.path.counters_b
        assert b.delivered_rows > 0 and b.used_rows > 0, name  # the workers brought its rows
        assert t.path.delivering_pids and t.path.delivering_pids <= workers, name
        assert not t.path.fallbacks, name
    for i, name in enumerate(("dlrm_v1", "deepfm_v1")):
        losses, ids, rows = _alone_b(raw, i, tmp_path / f"alone{i}")
        assert multi.trainers[name].losses == losses, name
        _same_rows(*got[name], ids, rows)


def test_collaborative_model_whose_workers_fail_falls_back_alone(tmp_path):
    """deepfm's data-worker part cannot reach the PS (its link goes to dead endpoints): deepfm
    falls back to its own pulls, picking up from its last trained batch, and trains exactly as
    alone; dlrm's workers go on bringing its rows."""
    from cosparse.ps import EmbeddedShards

    raw = multi_raw(write_spec(tmp_path / "spec.yaml"), steps=12)
    with EmbeddedShards(2, [], tmp_path / "ps") as sh:
        raw = _collaborative(raw, sh.endpoints)
        multi = MultiTrainer(config_from_mapping(raw), log=lambda m: None)
        try:
            codec = multi.trainers["deepfm_v1"].path.codec
            dead = tuple(f"tcp://127.0.0.1:{_free_port()}" for _ in range(2))
            codec.ps = dataclasses.replace(codec.ps, endpoints=dead, timeout_s=0.5)
            out = multi.run()
        finally:
            multi.close()
    deepfm, dlrm = multi.trainers["deepfm_v1"], multi.trainers["dlrm_v1"]
    assert len(deepfm.path.fallbacks) == 1 and "deepfm" not in dlrm.path.fallbacks
    assert "pulling" in deepfm.path.fallbacks[0] and "failed" in deepfm.path.fallbacks[0]
    assert not dlrm.path.fallbacks and dlrm.path.counters_b.used_rows > 0
    assert deepfm.state.step == dlrm.state.step == 12 and not out["failed_models"]
    losses, _, _ = _alone_b(raw, 1, tmp_path / "alone")
    assert deepfm.losses == losses
