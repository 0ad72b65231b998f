"""The exactness matrix: tiered placements train bit-identically to the all-resident engine.

Each cell trains DLRM for 150 steps with a bounded device tier and compares losses, final rows
(with their optimizer state) and dense weights with ``torch.equal`` against the all-resident run
of the same dataset and optimizer. The cells are an explicit list covering every value of every
dimension and every (policy, optimizer) pair, not the full cross product.
"""

from __future__ import annotations

import copy
import functools

import numpy as np
import pytest
from exactness import (
    CRITEO,
    base_config,
    collaborative,
    first_difference,
    ps_direct,
    run,
    tiered,
    trace_stats,
)

DATASETS = ["zipf", "criteo"]
# (optimizer, policy, capacity, lookahead, workers, host, horizon)
CELLS = [
    ("sgd", "lru", "min", 0, 0, "100%", 0),
    ("sgd", "lfu", "10%", 4, 2, "100%", 8),
    ("sgd", "hotness", "100%", 4, 0, "100%", 0),
    ("rowwise_adagrad", "lru", "10%", 0, 0, "25%+spill", 0),
    ("rowwise_adagrad", "lfu", "100%", 0, 2, "100%", 0),
    ("rowwise_adagrad", "hotness", "min", 4, 0, "100%", 8),
    ("adam", "lru", "100%", 4, 0, "100%", 0),
    ("adam", "lfu", "min", 4, 0, "25%+spill", 0),
    ("adam", "hotness", "10%", 0, 2, "100%", 8),
]


def _skip_missing(dataset: str) -> None:
    if dataset == "criteo" and not CRITEO.exists():
        pytest.skip("../shared/data/criteo is not present")


@functools.cache
def reference(dataset: str, optimizer: str):
    return run(base_config(dataset, optimizer))


@functools.cache
def stats(dataset: str, lookahead: int):
    return trace_stats(base_config(dataset, "sgd"), lookahead)


def cell_config(dataset, optimizer, policy, capacity, lookahead, workers, host, horizon=0):
    st = stats(dataset, lookahead)
    touched = max(v[0] for v in st.values())
    window = max(v[1] for v in st.values())  # unique rows of lookahead+1 batches
    one_batch = max(v[1] for v in stats(dataset, 0).values())
    rows = {"min": window, "10%": max(touched // 10, one_batch), "100%": touched}[capacity]
    host_rows = None if host == "100%" else max(touched // 4, 2 * rows)
    cfg = tiered(base_config(dataset, optimizer), rows, lookahead, workers, policy, host_rows,
                 horizon)
    return cfg


def test_cells_cover_every_value_and_every_policy_optimizer_pair():
    cols = list(zip(*CELLS, strict=True))
    assert set(cols[0]) == {"sgd", "rowwise_adagrad", "adam"}
    assert set(cols[1]) == {"lru", "lfu", "hotness"}
    assert set(cols[2]) == {"min", "10%", "100%"}
    assert set(cols[3]) == {0, 4} and set(cols[4]) == {0, 2} and set(cols[6]) == {0, 8}
    assert len({(c[0], c[1]) for c in CELLS}) == 9


@pytest.mark.parametrize("dataset", DATASETS)
@pytest.mark.parametrize("cell", CELLS, ids=lambda c: "-".join(map(str, c)))
def test_tiered_cell_is_bit_identical(dataset, cell):
    _skip_missing(dataset)
    optimizer = cell[0]
    got = run(cell_config(dataset, *cell))
    diff = first_difference(got, reference(dataset, optimizer))
    assert diff is None, f"{dataset} {cell}: {diff}"
    counters = got.trainer.ec.counters()
    assert sum(c.lookups for c in counters.values()) > 0
    if cell[2] != "100%":
        assert sum(c.evictions_device for c in counters.values()) > 0  # tiers really moved rows


def test_checkpoint_with_tiers_resumes_bit_identically(tmp_path):
    cfg = cell_config("zipf", "rowwise_adagrad", "hotness", "10%", 4, 0, "25%+spill")
    got = run(cfg, resume_at=75, ckpt_dir=tmp_path / "ck")
    assert first_difference(got, reference("zipf", "rowwise_adagrad")) is None
    import json

    meta = json.loads((tmp_path / "ck" / "step_00000075" / "meta.json").read_text())
    assert meta["step"] == 75
    with np.load(tmp_path / "ck" / "step_00000075" / "table-lo.npz") as z:
        assert z["device_ids"].shape[0] > 0  # residency is recorded


def test_the_matrix_catches_one_ulp_of_corruption_in_an_eviction(monkeypatch):
    """A test of the test: one row nudged by one ulp while it is written back must be caught."""
    from cosparse.store.tiered import TieredTable

    original = TieredTable._host_put
    done = []

    def corrupting_host_put(self, ids, hs, src, seq):
        if not done and src.shape[0]:  # nudge the first row on its way down by one ulp
            row = self.dev.slab_np[src[0]]
            row[0] = np.nextafter(row[0], np.float32(np.inf))
            done.append(int(ids[0]))
        return original(self, ids, hs, src, seq)

    monkeypatch.setattr(TieredTable, "_host_put", corrupting_host_put)
    got = run(cell_config("zipf", "sgd", "lru", "min", 0, 0, "100%"))
    assert done, "no eviction happened, so nothing was corrupted"
    diff = first_difference(got, reference("zipf", "sgd"))
    assert diff is not None
    print("caught:", diff)


def test_rows_planned_ahead_are_never_evicted_before_their_batch_trains(monkeypatch):
    """With lookahead k, the rows of batch t+k stay in their device slots until t+k trains."""
    from cosparse.store.tiered import TieredTable

    planned: dict[int, list] = {}
    trained: dict[int, int] = {}
    plan, gather = TieredTable.plan, TieredTable.gather

    def recording_plan(self, unique, seq, shrink):
        batch_plan = plan(self, unique, seq, shrink)
        planned.setdefault(id(self), []).append((seq, unique.copy(), batch_plan.slots.copy()))
        return batch_plan

    def checking_gather(self, slots):
        queue = planned[id(self)]
        seq, unique, expect = queue.pop(0)
        assert np.array_equal(slots, expect), f"batch {seq}: slots changed"
        assert self.dev.occupied[slots].all(), f"batch {seq}: a planned row was evicted"
        assert np.array_equal(self.dev.slot_ids[slots], unique), f"batch {seq}: slot reused"
        trained[id(self)] = trained.get(id(self), 0) + 1
        return gather(self, slots)

    monkeypatch.setattr(TieredTable, "plan", recording_plan)
    monkeypatch.setattr(TieredTable, "gather", checking_gather)
    cfg = cell_config("zipf", "sgd", "hotness", "min", 4, 0, "100%", horizon=8)
    got = run(cfg)
    assert all(n == 150 for n in trained.values()) and len(trained) == 2
    assert got.trainer.ec.planner.shrinks == 0  # min capacity = the window: no shrink needed
    counters = got.trainer.ec.counters()
    assert sum(c.evictions_device for c in counters.values()) > 0


# architecture A: (dataset, optimizer, shards, lookahead, device cache); lookahead 1 is arch-a's
# prefetch; the cache is off or 10% of the rows touched (at least the window's rows)
PS_CELLS = [
    ("zipf", "sgd", 1, 0, "off"),
    ("zipf", "adam", 2, 1, "10%"),
    ("criteo", "rowwise_adagrad", 2, 1, "off"),
    ("criteo", "sgd", 1, 1, "10%"),
]


@pytest.mark.parametrize("cell", PS_CELLS, ids=lambda c: "-".join(map(str, c)))
def test_ps_direct_is_bit_identical_to_all_resident(cell):
    """Rows on real PS shard processes, pulled and pushed every step (prefetch included)."""
    import os

    dataset, optimizer, shards, lookahead, cache = cell
    _skip_missing(dataset)
    cache_rows = None
    if cache == "10%":
        st = stats(dataset, lookahead)
        cache_rows = max(max(v[0] for v in st.values()) // 10, max(v[1] for v in st.values()))
    got = run(ps_direct(base_config(dataset, optimizer), shards, lookahead, cache_rows))
    diff = first_difference(got, reference(dataset, optimizer))
    assert diff is None, f"{cell}: {diff}"
    tables = got.trainer.ec.tables.values()
    if cache_rows is not None:  # the cache served hits and dropped victims (written through)
        counters = got.trainer.ec.counters()
        assert sum(c.device_hits for c in counters.values()) > 0
        assert sum(c.evictions_device for c in counters.values()) > 0
    elif lookahead:  # rows a batch in flight updates were pulled after its push, not before
        assert sum(t.deferred_rows for t in tables) > 0
    assert got.trainer.path.ps.shards is None  # closed by the trainer
    for pid in got.trainer_pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.parametrize("dataset", DATASETS)
def test_tiers_over_the_remote_ps_are_bit_identical(dataset):
    """Device 10% over host 25% whose victims spill to 2 real PS shard processes."""
    _skip_missing(dataset)
    st = stats(dataset, 4)
    touched = max(v[0] for v in st.values())
    rows = max(touched // 10, max(v[1] for v in st.values()))
    cfg = tiered(base_config(dataset, "rowwise_adagrad"), rows, 4, 0, "hotness",
                 host_rows=max(touched // 4, 2 * rows), spill_to="remote")
    got = run(cfg)
    assert first_difference(got, reference(dataset, "rowwise_adagrad")) is None
    counters = got.trainer.ec.counters()
    assert sum(c.bytes_host_backing for c in counters.values()) > 0  # rows went down to the PS
    assert sum(c.backing_hits for c in counters.values()) > 0  # and came back up from it
    assert got.trainer_pids and got.trainer.path.ps.shards is None


# (dataset, optimizer, workers, lookahead, device, host, shards)
COLLAB_CELLS = [
    ("zipf", "rowwise_adagrad", 0, 4, "10%", "10%", 2),
    ("zipf", "adam", 2, 0, "1%", "100%", 1),
    ("criteo", "sgd", 2, 4, "1%", "10%", 2),
    ("criteo", "rowwise_adagrad", 0, 0, "10%", "100%", 1),
]


def collab_config(dataset, optimizer, workers, lookahead, device, host, shards, fallback=None):
    st = stats(dataset, lookahead)
    touched = max(v[0] for v in st.values())
    window = max(v[1] for v in st.values())
    dev = max(touched // (100 if device == "1%" else 10), window)
    host_rows = touched if host == "100%" else max(touched // 10, window)
    return collaborative(base_config(dataset, optimizer), dev, host_rows, lookahead, workers,
                         shards, fallback)


def test_collaborative_cells_cover_every_value():
    cols = list(zip(*COLLAB_CELLS, strict=True))
    assert set(cols[2]) == {0, 2} and set(cols[3]) == {0, 4} and set(cols[4]) == {"1%", "10%"}
    assert set(cols[5]) == {"10%", "100%"} and set(cols[6]) == {1, 2}


@pytest.mark.parametrize("cell", COLLAB_CELLS, ids=lambda c: "-".join(map(str, c)))
def test_collaborative_supply_is_bit_identical(cell):
    """Architecture B: data workers deliver the rows the resident filter does not hold."""
    import os

    dataset, optimizer, workers, *_ = cell
    _skip_missing(dataset)
    got = run(collab_config(*cell))
    diff = first_difference(got, reference(dataset, optimizer))
    assert diff is None, f"{cell}: {diff}"
    t, sc = got.trainer, got.trainer.path.counters_b
    counters = t.ec.counters()
    assert sc.delivered_rows > 0 and sc.used_rows > 0
    assert sum(c.delivered_hits for c in counters.values()) == sc.used_rows
    assert sc.used_rows + sc.wasted_rows + sc.stale_drops == sc.delivered_rows
    if cell[5] == "10%":  # host victims went down to the PS and came back delivered
        assert sum(c.bytes_host_backing for c in counters.values()) > 0
    if workers:  # the rows came from the data-worker processes, not from the trainer's
        assert t.path.delivering_pids and os.getpid() not in t.path.delivering_pids
    else:
        assert t.path.delivering_pids == {os.getpid()}
    assert not t.path.fallbacks


# regularisation (issue 15): l2 on the rows, dropout in the towers, AdamW's decay on the dense
# model; every placement stays bit-identical to the all-resident run (the masks follow the step)
REGULARISED = ["tiered", "tiered+resume", "ps-direct", "collaborative"]


def regularised(cfg):
    from cosparse.config import DenseOptimizerConfig

    cfg = copy.deepcopy(cfg)
    for t in cfg.tables:
        t.optimizer.l2 = 1e-3
    cfg.model.dropout = 0.2
    cfg.model.dense_optimizer = DenseOptimizerConfig(kind="adam", lr=0.01, weight_decay=0.01)
    return cfg


@functools.cache
def regularised_reference():
    return run(regularised(base_config("zipf", "adam")))


@pytest.mark.parametrize("placement", REGULARISED)
def test_regularised_training_is_bit_identical_on_every_placement(placement, tmp_path):
    from cosparse.nn.dropout import SeededDropout

    if placement.startswith("tiered"):
        cfg = regularised(cell_config("zipf", "adam", "hotness", "10%", 4, 0, "25%+spill"))
    elif placement == "ps-direct":
        st = stats("zipf", 1)
        cache = max(max(v[0] for v in st.values()) // 10, max(v[1] for v in st.values()))
        cfg = regularised(ps_direct(base_config("zipf", "adam"), 2, 1, cache))
    else:
        cfg = regularised(collab_config("zipf", "adam", 0, 4, "10%", "10%", 2))
    resume = placement.endswith("resume")
    got = run(cfg, resume_at=75 if resume else None, ckpt_dir=tmp_path / "ck" if resume else None)
    diff = first_difference(got, regularised_reference())
    assert diff is None, f"{placement}: {diff}"
    model = got.trainer.model
    assert model.dropout is not None and [s.p for s in model.dropout.sources] == [0.2]
    assert any(isinstance(m, SeededDropout) for m in model.modules())
    assert all(t.optimizer.l2 == 1e-3 for t in got.trainer.cfg.tables)
