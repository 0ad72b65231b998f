"""Serving export: ``cosparse export`` after real training runs (all-resident, and architecture A
on real PS shard processes with incremental snapshots) matches the trainer's rows bitwise; a
full export plus ``--since`` deltas, applied by ``cosparse.serving.load``, equals the full export
at the later step; too old a step, a corrupted file and a broken chain are clear errors."""

from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import pytest
from exactness import base_config, ps_direct, tiered

from cosparse.cli import main
from cosparse.config import ConfigError
from cosparse.config.validate import validate
from cosparse.serving import ServingError, load
from cosparse.serving.export import export
from cosparse.train.trainer import Trainer


def _trainer_rows(trainer: Trainer) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The trainer's rows now (embeddings only), sorted by ID."""
    out = {}
    for name, st in trainer.ec.export_rows().items():
        order = np.argsort(st["ids"])
        dim = next(t.dim for t in trainer.cfg.tables if t.name == name)
        out[name] = (st["ids"][order], np.ascontiguousarray(st["rows"][order, :dim]))
    return out


def _assert_bitwise(tables, rows) -> None:
    assert set(tables) == set(rows)
    for name, (ids, emb) in rows.items():
        t = tables[name]
        assert np.array_equal(t.ids, ids), name
        assert t.rows.dtype == np.float32
        assert np.array_equal(t.rows.view(np.uint32), emb.view(np.uint32)), name
        assert np.array_equal(t.lookup(ids).view(np.uint32), emb.view(np.uint32)), name


def _assert_same(a, b) -> None:
    assert set(a) == set(b)
    for name in a:
        assert np.array_equal(a[name].ids, b[name].ids), name
        assert np.array_equal(a[name].rows.view(np.uint32), b[name].rows.view(np.uint32)), name


@pytest.fixture(scope="module")
def resident_run(tmp_path_factory):
    """An all-resident run saved at steps 10..40 (keep 3), exported as it goes."""
    tmp = tmp_path_factory.mktemp("resident")
    cfg = copy.deepcopy(base_config("zipf", "sgd"))
    cfg.train.steps = 40
    cfg.train.checkpoint.dir = str(tmp / "ck")
    cfg.train.checkpoint.every = 10
    cfg.train.checkpoint.keep = 3
    trainer = Trainer(validate(cfg), log=lambda m: None)
    rows = {}
    try:
        for step in (10, 20, 30, 40):
            trainer.run(steps=step, evaluate=False)
            assert trainer.state.step == step
            rows[step] = _trainer_rows(trainer)
            if step == 10:  # (checkpoint 10 is pruned by step 40)
                export(tmp / "ck", tmp / "full-10")
                export(tmp / "ck", tmp / "full-10.npy", file_format="npy")
    finally:
        trainer.close()
    return tmp, rows


def test_resident_full_export_matches_the_trainer_bitwise(resident_run):
    tmp, rows = resident_run
    _assert_bitwise(load(tmp / "full-10"), rows[10])
    _assert_bitwise(load(tmp / "full-10.npy"), rows[10])
    m = export(tmp / "ck", tmp / "full-40", shard_rows=500)  # several files per table
    _assert_bitwise(load(tmp / "full-40"), rows[40])
    assert m["kind"] == "full" and m["step_range"] == [0, 40]
    assert all(len([f for f in t["files"]]) > 1 for t in m["tables"].values())
    assert all(t["source"] == "checkpoint" and t["dim"] == 8 for t in m["tables"].values())
    # no optimizer state, one column of embeddings per dim
    import pyarrow.parquet as pq

    part = pq.read_table(tmp / "full-40" / m["tables"]["lo"]["files"][0]["path"])
    assert part.schema.names == ["id", "embedding"]
    assert part.schema.field("embedding").type.list_size == 8


def test_resident_since_delta_applied_by_load_equals_the_later_full_export(resident_run):
    tmp, rows = resident_run
    d = tmp / "since-20"
    m = export(tmp / "ck", d, since=20)
    assert m["kind"] == "delta" and m["since"] == 20 and m["step_range"] == [20, 40]
    full = tmp / "full-at-20"
    export(tmp / "ck" / "step_00000020", full)
    _assert_bitwise(load(full), rows[20])
    later = load(full, deltas=[d])
    _assert_bitwise(later, rows[40])
    for name, t in m["tables"].items():  # only the rows that changed: fewer than all
        assert 0 < t["rows"] < len(later[name]) and t["method"] == "diff"
    # two deltas in a chain: 20 -> 30 -> 40
    export(tmp / "ck" / "step_00000030", tmp / "d-20-30", since=20)
    export(tmp / "ck", tmp / "d-30-40", since=30, file_format="npy")
    _assert_same(load(full, deltas=[tmp / "d-20-30", tmp / "d-30-40"]), later)
    with pytest.raises(ServingError, match="since step 30.*at step 20"):
        load(full, deltas=[tmp / "d-30-40"])


def test_too_old_since_names_the_oldest_step(resident_run):
    tmp, _ = resident_run
    with pytest.raises(ServingError, match="--since 10: older than the oldest step still "
                                           "available, 20"):
        export(tmp / "ck", tmp / "too-old", since=10)
    with pytest.raises(ServingError, match=r"--since 25: no save .* \[20, 30, 40\]"):
        export(tmp / "ck", tmp / "between", since=25)
    assert not (tmp / "too-old").exists() and not (tmp / "between").exists()


def test_fp16_export_is_the_rows_rounded_to_fp16(resident_run):
    tmp, rows = resident_run
    m = export(tmp / "ck", tmp / "fp16", fp16=True)
    assert m["dtype"] == "float16"
    tables = load(tmp / "fp16")
    for name, (ids, emb) in rows[40].items():
        t = tables[name]
        assert t.rows.dtype == np.float16 and np.array_equal(t.ids, ids)
        np.testing.assert_allclose(t.rows.astype(np.float32), emb, rtol=2**-11, atol=2**-24)
        assert np.array_equal(t.rows, emb.astype(np.float16))


def test_corrupted_file_is_a_checksum_error(resident_run, tmp_path):
    tmp, _ = resident_run
    m = export(tmp / "ck", tmp_path / "e", file_format="npy")
    victim = tmp_path / "e" / m["tables"]["hi"]["files"][1]["path"]  # rows of shard 0
    raw = bytearray(victim.read_bytes())
    raw[-3] ^= 0xFF
    victim.write_bytes(bytes(raw))
    with pytest.raises(ServingError, match=f"{victim.name}: checksum mismatch"):
        load(tmp_path / "e")
    victim.unlink()
    with pytest.raises(ServingError, match="missing"):
        load(tmp_path / "e")


def test_missing_ids_are_zeros_with_a_mask(resident_run):
    tmp, rows = resident_run
    t = load(tmp / "full-10")["lo"]
    ids = np.array([t.ids[3], -7, t.ids[0], t.ids[-1] + 1], np.int64)
    got, found = t.find(ids)
    assert found.tolist() == [True, False, True, False]
    assert np.array_equal(got[0], t.rows[3]) and not got[[1, 3]].any()


def test_cli_export_and_its_refusal(resident_run, tmp_path, capsys):
    tmp, _ = resident_run
    assert main(["export", "--checkpoint", str(tmp / "ck"), "--since", "30", "--format", "npy",
                 "--out", str(tmp_path / "d")]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["kind"] == "delta" and said["step_range"] == [30, 40]
    assert main(["export", "--checkpoint", str(tmp / "ck"), "--since", "0",
                 "--out", str(tmp_path / "old")]) != 0
    assert "oldest step still available, 20" in capsys.readouterr().err
    assert main(["export", "--checkpoint", str(tmp / "ck"), "--out", str(tmp_path / "d")]) != 0
    assert "exists and is not empty" in capsys.readouterr().err


@pytest.fixture(scope="module")
def ps_run(tmp_path_factory):
    """Rows on 2 real PS shards, snapshotted incrementally with every checkpoint (10..40); the
    trainer keeps 1 checkpoint but the PS the snapshots of 3 saves (store.remote.snapshot_keep),
    so ``--since`` reaches back past the kept checkpoints. The tables live in PS namespace
    ``ranker`` (snapshots key them ``ranker/lo``). Exported at 10 and 30 as it goes."""
    tmp = tmp_path_factory.mktemp("ps_direct")
    cfg = copy.deepcopy(ps_direct(base_config("zipf", "adam"), num_shards=2, lookahead=1))
    cfg.train.steps = 40
    cfg.store.remote.data_dir = str(tmp / "ps")
    cfg.store.remote.snapshot_keep = 3
    cfg.store.remote.namespace = "ranker"
    cfg.train.checkpoint.dir = str(tmp / "ck")
    cfg.train.checkpoint.every = 10
    cfg.train.checkpoint.keep = 1
    cfg.train.checkpoint.incremental = True
    trainer = Trainer(validate(cfg), log=lambda m: None)
    rows, manifests = {}, {}
    try:
        for step in (10, 20, 30, 40):
            trainer.run(steps=step, evaluate=False)
            rows[step] = _trainer_rows(trainer)  # the PS's rows, dumped from the shards
            if step in (10, 30):
                manifests[step] = export(tmp / "ck", tmp / f"full-{step}")
            if step == 30:  # snapshots 10 (full), 20, 30 (incremental): the chain says
                manifests["10-30"] = export(tmp / "ck", tmp / "d-10-30", since=10)
    finally:
        trainer.close()
    return tmp, cfg, rows, manifests


def test_ps_direct_export_from_incremental_snapshots(ps_run):
    tmp, _, rows, manifests = ps_run
    for step in (10, 30):
        m = manifests[step]
        assert {t["source"] for t in m["tables"].values()} == {"ps-snapshots"}
        _assert_bitwise(load(tmp / f"full-{step}"), rows[step])
    m = manifests["10-30"]
    assert {t["method"] for t in m["tables"].values()} == {"ps-incremental"}
    assert all(0 < t["rows"] for t in m["tables"].values())
    _assert_bitwise(load(tmp / "full-10", deltas=[tmp / "d-10-30"]), rows[30])
    assert len(list((tmp / "ck").glob("step_*"))) == 1  # keep 1
    # at 40 (a full snapshot again): 20 and 30 are still there, compared state to state
    out = tmp / "case1"
    m = export(tmp / "ck", out / "d-30-40", since=30)
    assert {t["method"] for t in m["tables"].values()} == {"diff"}
    export(tmp / "ck", out / "full-40")
    _assert_bitwise(load(out / "full-40"), rows[40])
    _assert_bitwise(load(tmp / "full-10", deltas=[tmp / "d-10-30", out / "d-30-40"]), rows[40])
    with pytest.raises(ServingError, match="oldest step still available, 20"):
        export(tmp / "ck", out / "old", since=10)


def test_external_shards_data_dirs_in_shard_order(ps_run):
    tmp, _, rows, _ = ps_run
    roots = [str(tmp / "ps" / f"shard-{i}") for i in range(2)]  # (here: the embedded ones)
    export(tmp / "ck", tmp / "case2" / "by-root", ps_root=roots)
    _assert_bitwise(load(tmp / "case2" / "by-root"), rows[40])
    with pytest.raises(ServingError, match="snapshot of PS shard 1, expected 0"):
        export(tmp / "ck", tmp / "case2" / "swapped", ps_root=roots[::-1])
    with pytest.raises(ServingError, match="--ps-root: given 1 times, the checkpoint's PS had 2"):
        export(tmp / "ck", tmp / "case2" / "one", ps_root=roots[:1])
    with pytest.raises(ServingError, match="are not all under"):
        export(tmp / "ck", tmp / "case2" / "elsewhere", ps_root=[str(tmp / "x"), str(tmp / "y")])


def test_a_resumed_run_carries_the_snapshot_history_on(ps_run, tmp_path):
    """Resumed at 40 and saved at 50 (keep 1): step 30 is reachable through the history the
    resumed run carried on alone (a copy of the run's directories: the fixture's stay)."""
    tmp, cfg, rows, _ = ps_run
    shutil.copytree(tmp / "ck", tmp_path / "ck")
    shutil.copytree(tmp / "ps", tmp_path / "ps")
    cfg = copy.deepcopy(cfg)
    cfg.train.steps = 50
    cfg.train.checkpoint.dir = str(tmp_path / "ck")
    cfg.store.remote.data_dir = str(tmp_path / "ps")
    again = Trainer(cfg, log=lambda m: None)
    try:
        again.resume(str(tmp_path / "ck"))
        again.run(evaluate=False)
        at_50 = _trainer_rows(again)
    finally:
        again.close()
    assert sorted(p.name for p in (tmp_path / "ck").glob("step_*")) == ["step_00000050"]
    export(tmp_path / "ck", tmp_path / "d-30-50", since=30)
    _assert_bitwise(load(tmp / "full-30", deltas=[tmp_path / "d-30-50"]), at_50)
    with pytest.raises(ServingError, match="oldest step still available, 30"):
        export(tmp_path / "ck", tmp_path / "old", since=20)


def test_snapshot_keep_below_checkpoint_keep_is_refused():
    cfg = copy.deepcopy(ps_direct(base_config("zipf", "sgd"), num_shards=2, lookahead=1))
    cfg.train.checkpoint.keep = 3
    cfg.store.remote.snapshot_keep = 2
    with pytest.raises(ConfigError, match=r"store.remote.snapshot_keep: 2 is fewer than "
                                          r"train.checkpoint.keep \(3\)"):
        validate(cfg)
    cfg.store.remote.snapshot_keep = 0
    with pytest.raises(ConfigError, match="store.remote.snapshot_keep"):
        validate(cfg)


def test_tiered_run_with_ttl_delta_removes_the_dropped_ids(tmp_path):
    """Tiered tables (a bounded device tier over the host) whose TTL drops rows: the delta
    carries the IDs dropped since, and load removes them."""
    cfg = copy.deepcopy(tiered(base_config("zipf", "sgd"), device_rows=4000, lookahead=1,
                               workers=0, policy="lru"))
    cfg.store.ttl_steps = 8
    cfg.train.steps = 30
    cfg.train.checkpoint.dir = str(tmp_path / "ck")
    cfg.train.checkpoint.every = 10
    trainer = Trainer(validate(cfg), log=lambda m: None)
    rows = {}
    try:
        for step in (10, 20, 30):
            trainer.run(steps=step, evaluate=False)
            rows[step] = _trainer_rows(trainer)
    finally:
        trainer.close()
    export(tmp_path / "ck" / "step_00000020", tmp_path / "full-20")
    _assert_bitwise(load(tmp_path / "full-20"), rows[20])
    m = export(tmp_path / "ck", tmp_path / "d", since=20)
    assert sum(t["removed"] for t in m["tables"].values()) > 0  # the TTL dropped rows
    assert {t["method"] for t in m["tables"].values()} == {"diff"}
    _assert_bitwise(load(tmp_path / "full-20", deltas=[tmp_path / "d"]), rows[30])


def test_many_rank_checkpoint_exports_its_rows(tmp_path):
    """A 2-rank run's DCP checkpoint (tables column-wise, table-wise and replicated) exports
    the rows the ranks held at the end (a real torchrun of gloo ranks)."""
    from test_parallel import SAVE_2, _ckpt, _merged, _torchrun

    cases = [{"name": "save_2", "config": _ckpt(SAVE_2, tmp_path / "two", 4, 4)}]
    _torchrun(2, cases, tmp_path, 120)
    got = _merged("save_2", tmp_path, cases[0]["config"])
    dims = {t["name"]: t["dim"] for t in cases[0]["config"]["tables"]}
    want = {}
    for n, r in got["rows"].items():
        order = np.argsort(r["ids"])
        want[n] = (r["ids"][order], np.ascontiguousarray(r["rows"][order, : dims[n]]))
    m = export(tmp_path / "two", tmp_path / "e2")
    assert {t["source"] for t in m["tables"].values()} == {"sharded-checkpoint"}
    _assert_bitwise(load(tmp_path / "e2"), want)
