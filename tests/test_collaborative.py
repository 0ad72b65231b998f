"""Architecture B's parts: the resident filter, shared-memory batches, stale detection, link
shaping, the byte accounting of the worker and trainer links, and the fallback to ps-direct."""

from __future__ import annotations

import copy
import functools
import os
import signal
import threading
import time

import numpy as np
import pytest
from exactness import base_config, collaborative, first_difference, run, trace_stats

from cosparse.config import ConfigError, validate
from cosparse.link import LinkShaper
from cosparse.supply.collaborative import SupplyFailure
from cosparse.supply.collaborative.resident_filter import FilterBoard, FilterLayout, FilterView
from cosparse.supply.collaborative.shared_batch import read_arrays, write_arrays
from cosparse.supply.collaborative.supply import CollaborativeSupply, DeliveredSource
from cosparse.supply.collaborative.types import DeliveredRows
from cosparse.supply.collaborative.writeback_log import WriteBackLog
from cosparse.supply.shared_memory import shared_dir
from cosparse.train.trainer import Trainer


# --- parts ----------------------------------------------------------------------------------
def test_resident_filter_has_no_false_negatives_and_few_false_positives(tmp_path):
    layout = FilterLayout.sized(str(tmp_path / "f"), {"a": 10_000, "b": 100}, bits_per_row=10)
    board = FilterBoard(layout)
    view = FilterView(layout)
    assert view.resident("a", np.arange(5)) is None  # nothing published yet
    rng = np.random.default_rng(0)
    held = rng.choice(1 << 40, 10_000, replace=False).astype(np.int64)
    board.publish({"a": held, "b": held[:100]}, step=7)
    mask, seq = view.resident("a", held)
    assert mask.all() and seq == board.seq and seq % 2 == 0
    others = rng.integers(1 << 41, 1 << 42, 20_000)
    fp = view.resident("a", others)[0].mean()
    assert fp < 0.05, fp
    assert view.resident("b", held[:100])[0].all()
    board.publish({"a": held[:10]}, step=8)  # a table left out is published empty
    assert not view.resident("b", held[:100])[0].any()
    board.close()
    assert not (tmp_path / "f").exists()


def test_resident_filter_refuses_more_bits_per_id_than_one_mix_gives(tmp_path):
    FilterLayout.sized(str(tmp_path / "f"), {"a": 100}, bits_per_row=10, k=5)
    with pytest.raises(ValueError, match="k = 6 bits per ID"):
        FilterLayout.sized(str(tmp_path / "f"), {"a": 100}, bits_per_row=10, k=6)


def test_shared_batch_round_trip_unlinks_the_file():
    d = shared_dir("cosparse-test-")
    try:
        arrays = {"ids": np.arange(10, dtype=np.int64), "rows": np.ones((10, 3), np.float32),
                  "empty": np.zeros(0, np.int64), "flag": np.array([True, False])}
        path = os.path.join(d, "b")
        layout, payload = write_arrays(path, arrays)
        assert payload == sum(a.nbytes for a in arrays.values())
        back = read_arrays(path, layout)
        assert not os.path.exists(path)
        for k, a in arrays.items():
            assert back[k].dtype == a.dtype and np.array_equal(back[k], a)
        back["rows"][0, 0] = 5.0  # copy-on-write views are writable
    finally:
        os.rmdir(d)


def test_a_delivered_row_older_than_the_last_write_back_is_dropped():
    log = WriteBackLog()
    ids = np.array([3, 5, 9, 11], dtype=np.int64)
    rows = np.arange(8, dtype=np.float32).reshape(4, 2)
    counters = np.array([10, 10], dtype=np.int64)  # both shards' write counters at pull time
    log.record(np.array([5, 11], dtype=np.int64), np.array([10, 12], dtype=np.int64))
    src = DeliveredSource(DeliveredRows(ids, rows, counters), log, 1)
    # with one shard: 11 was written back at 12 > 10 (stale); 5 at 10 (the pull saw it)
    src.num_shards = 1
    want = np.array([11, 2, 5, 3, 9], dtype=np.int64)
    served, got = src.take(want)
    assert served.tolist() == [False, False, True, True, True]
    assert np.array_equal(got, rows[[1, 0, 2]])
    assert (src.used, src.stale) == (3, 1)


def test_link_is_one_bucket_shared_by_every_sender():
    link = LinkShaper(mbps=8.0)  # 1 MB/s
    t0 = time.time()
    threads = [threading.Thread(target=link.transfer, args=(50_000,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.time() - t0
    assert 0.18 <= took < 0.6, took  # 200 kB through one 1 MB/s link, not four
    assert link.bytes == 200_000
    slow = LinkShaper(None, latency_ms=20)
    t0 = time.time()
    slow.transfer(10, messages=2)
    assert time.time() - t0 >= 0.039


def test_collaborative_config_errors_name_the_settings():
    cfg = collaborative(base_config("zipf", "sgd"), 100, 200, 1, 0)
    bad = copy.deepcopy(cfg)
    bad.store.host.rows = None
    with pytest.raises(ConfigError, match="store.host"):
        validate(bad)
    bad = copy.deepcopy(cfg)
    bad.store.host.spill_to = "memory"
    with pytest.raises(ConfigError, match="spill_to"):
        validate(bad)
    bad = base_config("zipf", "sgd")
    bad.supply.fallback = "ps-direct"
    with pytest.raises(ConfigError, match="supply.fallback"):
        validate(bad)


# --- whole runs -----------------------------------------------------------------------------
@functools.cache
def _sizes() -> tuple[int, int]:
    st = trace_stats(base_config("zipf", "rowwise_adagrad"), 4)
    touched = max(v[0] for v in st.values())
    window = max(v[1] for v in st.values())
    return max(touched // 10, window), max(touched // 10, 2 * window)


def _config(workers: int, fallback: str | None = "ps-direct"):
    dev, host = _sizes()
    return collaborative(base_config("zipf", "rowwise_adagrad"), dev, host, 4, workers,
                         fallback=fallback)


@functools.cache
def _reference():
    return run(base_config("zipf", "rowwise_adagrad"))


def test_delivered_rows_add_nothing_to_the_trainers_ps_link():
    cfg = validate(_config(workers=2))
    t = Trainer(cfg, log=lambda m: None)
    try:
        t.run()
        pulled = t.path.ps.client.counters
        counters = t.ec.counters()
        sc = t.path.counters_b
        row_bytes = 4 * t.ec.tables["lo"].width
        trainer_rows = sum(c.backing_hits for c in counters.values())
        # the trainer's pull bytes are its own misses (rows + 16 B of ID and version each, plus
        # headers), none of the rows the workers brought
        assert pulled.bytes_pull <= trainer_rows * (row_bytes + 16) + 512 * pulled.requests
        assert sc.used_rows > 2 * trainer_rows
        assert sc.worker_ps_bytes >= sc.delivered_bytes > pulled.bytes_pull
        assert t.wire_bytes > sc.delivered_bytes  # samples plus delivered rows
        # each worker is its own OS process with its own PS connection
        assert len(t.path.delivering_pids) == 2 and t.path.delivering_pids <= t.data_worker_pids
        assert os.getpid() not in t.path.delivering_pids
    finally:
        t.close()


def _kill_a_worker_at(step: int, monkeypatch) -> list[int]:
    killed: list[int] = []
    original = Trainer._one_step

    def one_step(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if self.state.step == step and not killed:
            killed.append(self.stream.pids[1])
            os.kill(killed[0], signal.SIGKILL)
        return out

    monkeypatch.setattr(Trainer, "_one_step", one_step)
    return killed


def test_a_killed_worker_falls_back_to_ps_direct_bit_identically(monkeypatch):
    killed = _kill_a_worker_at(40, monkeypatch)
    got = run(_config(workers=2))
    assert killed
    assert first_difference(got, _reference()) is None
    assert len(got.trainer.path.fallbacks) == 1 and "exited" in got.trainer.path.fallbacks[0]
    assert got.trainer.path.counters_b.batches >= 40  # B delivered until the worker died
    with pytest.raises(ProcessLookupError):
        os.kill(killed[0], 0)


def test_a_killed_worker_without_fallback_fails_the_run(monkeypatch):
    _kill_a_worker_at(10, monkeypatch)
    t = Trainer(validate(_config(workers=2, fallback=None)), log=lambda m: None)
    try:
        with pytest.raises(SupplyFailure, match="supply.fallback"):
            t.run()
    finally:
        t.close()


def test_a_stalled_filter_publisher_falls_back(monkeypatch):
    original = CollaborativeSupply.publish
    calls = []

    def publish(self, step):
        calls.append(step)
        if threading.current_thread().name == "cosparse-filter" and len(calls) > 20:
            time.sleep(2.0)  # stalls past the timeout
        return original(self, step)

    monkeypatch.setattr(CollaborativeSupply, "publish", publish)
    cfg = _config(workers=0)
    cfg.supply.publish_timeout_s = 0.3
    got = run(cfg)
    assert first_difference(got, _reference()) is None
    assert len(got.trainer.path.fallbacks) == 1 and "stalled" in got.trainer.path.fallbacks[0]


# --- migration: checkpoints across architectures --------------------------------------------
def _arch(name: str, ps_dir):
    from exactness import ps_direct

    dev, _ = _sizes()
    if name == "a":
        cfg = ps_direct(base_config("zipf", "rowwise_adagrad"), 2, 1, dev)
    else:
        cfg = _config(workers=2)
    cfg.store.remote.data_dir = None if ps_dir is None else str(ps_dir)
    return cfg


@pytest.mark.parametrize("first,second,durable", [("a", "b", True), ("b", "a", False)])
def test_a_checkpoint_resumes_under_the_other_architecture(first, second, durable, tmp_path):
    """The rollback path: A's checkpoint continues under B and B's under A, bit-identically."""
    from cosparse.config import CheckpointConfig

    ps_dir = tmp_path / "ps" if durable else None
    one = validate(_arch(first, ps_dir))
    one.train.checkpoint = CheckpointConfig(dir=str(tmp_path / "ck"), every=60)
    t1 = Trainer(one, log=lambda m: None)
    try:
        t1.run(steps=60)
        losses = list(t1.losses)
    finally:
        t1.close()
    two = validate(_arch(second, ps_dir))
    t2 = Trainer(two, log=lambda m: None)
    try:
        t2.resume(str(tmp_path / "ck"))
        t2.run()
        rows = {}
        for name, state in t2.ec.export_rows().items():
            order = np.argsort(state["ids"])
            rows[name] = (state["ids"][order], state["rows"][order])
        from exactness import RunResult

        got = RunResult(losses + t2.losses, rows,
                        {k: v.clone() for k, v in t2.model.state_dict().items()}, t2, [])
    finally:
        t2.close()
    assert first_difference(got, _reference()) is None


def test_the_trainer_uses_the_workers_dedup(monkeypatch):
    """B's ID prep happens once, in the data workers: the trainer dedups no training batch itself
    (it builds only the transposed index from the worker's unique IDs and inverse index). The
    run stays bit-identical (the exactness cells check that in full)."""
    import cosparse.nn.embedding as embedding

    calls = []
    real = embedding.table_ids
    monkeypatch.setattr(embedding, "table_ids", lambda *a: calls.append(1) or real(*a))
    cfg = validate(_config(workers=2))
    cfg.train.steps = 20
    t = Trainer(cfg, log=lambda m: None)
    calls.clear()  # (sizing the tiers at start-up preps a few probe batches itself)
    try:
        t.run(evaluate=False)
        assert t.state.step == 20 and t.path.delivering_pids
        assert calls == [], f"the trainer deduped {len(calls)} tables of training batches"
    finally:
        t.close()


def test_planning_reaches_the_ps_once_per_kind_per_step_not_per_table():
    """The tables' spilled rows and their misses go to the PS as one request each per plan
    (``RemoteBatch``): at most two round trips a step, whatever the number of tables."""
    t = Trainer(validate(_config(workers=2)), log=lambda m: None)
    try:
        sync = t.run(evaluate=False)["sync"]
    finally:
        t.close()
    assert len(t.ec.tables) == 2
    print(f"\nB: {sync['by_site']['ps_request']['waits']:.2f} PS round trips per step")
    assert sync["by_site"]["ps_request"]["waits"] <= 2.05, sync
