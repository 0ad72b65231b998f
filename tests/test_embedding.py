"""EmbeddingCollection: pooled lookup and its fast backward against nn.EmbeddingBag, deterministic
row initialisation, and evaluation that leaves the tables untouched."""

import numpy as np
import pytest
import torch

from cosparse.batch import SparseBatch
from cosparse.config import InitConfig, OptimizerConfig, TableConfig
from cosparse.nn.embedding import EmbeddingCollection

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _batch(seed=0, b=64, keys=("a", "b"), vocab=50, max_len=4):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, max_len, (len(keys) * b,), generator=g)
    values = torch.randint(-vocab, vocab, (int(lengths.sum()),), generator=g) * 1_000_003
    return SparseBatch(list(keys), values, lengths, torch.zeros(b, 1), torch.zeros(b))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_forward_and_row_grads_match_embedding_bag(device, pooling):
    batch = _batch()
    tc = TableConfig(name="t", dim=8, features=["a", "b"], pooling=pooling,
                     optimizer=OptimizerConfig(kind="sgd", lr=1.0))
    ec = EmbeddingCollection([tc], device=device)
    out = ec(ec.prepare_and_stage(batch))
    table = ec.tables["t"]
    slots_all = torch.from_numpy(table.ids.lookup(batch.values.numpy())).to(device)
    weight = table.slab[: table.num_rows, :8].clone()
    ref_bag = torch.nn.EmbeddingBag.from_pretrained(weight, freeze=False, mode=pooling)
    ref = ref_bag(slots_all, batch.offsets[:-1].to(device))
    got = torch.cat([out["a"], out["b"]])
    torch.testing.assert_close(got, ref)
    upstream = torch.randn_like(got)
    (got * upstream).sum().backward()
    (ref * upstream).sum().backward()
    pending = ec._pending[0]
    dense_grad = torch.zeros_like(weight)
    dense_grad[torch.from_numpy(pending.slots).to(device)] = pending.weights.grad
    torch.testing.assert_close(dense_grad, ref_bag.weight.grad)
    # SGD with lr 1: new rows = old rows - grad, written back into the slab
    ec.apply_gradients()
    torch.testing.assert_close(table.slab[: table.num_rows, :8], weight - ref_bag.weight.grad)


def test_initial_rows_are_a_pure_function_of_seed_and_id():
    tc = TableConfig(name="t", dim=16, features=["a"], seed=11,
                     init=InitConfig(kind="normal", std=0.1))
    ids = np.array([5, -3, 2**62, 7], dtype=np.int64)
    e1 = EmbeddingCollection([tc], device="cpu").tables["t"]
    e2 = EmbeddingCollection([tc], device="cpu").tables["t"]
    e1.slots_for(np.array([99, 5, -3], dtype=np.int64))
    e1.slots_for(ids)
    e2.slots_for(ids[::-1].copy())
    r1 = e1.slab[torch.from_numpy(e1.ids.lookup(ids))]
    r2 = e2.slab[torch.from_numpy(e2.ids.lookup(ids))]
    assert torch.equal(r1, r2)
    assert torch.equal(torch.from_numpy(e1.initial_rows(ids)), r1)
    assert 0.05 < float(r1[:, :16].std()) < 0.2
    other_seed = EmbeddingCollection([TableConfig(name="t", dim=16, features=["a"], seed=12)])
    assert not torch.equal(torch.from_numpy(other_seed.tables["t"].initial_rows(ids)), r1)


def test_eval_reads_rows_without_creating_them():
    tc = TableConfig(name="t", dim=4, features=["a", "b"])
    ec = EmbeddingCollection([tc], device="cpu")
    ec(ec.prepare_and_stage(_batch(seed=1)))
    n = ec.tables["t"].num_rows
    snapshot = ec.tables["t"].slab[:n].clone()
    ec.eval()
    with torch.no_grad():
        out_eval = ec(_batch(seed=2, vocab=500))
    assert ec.tables["t"].num_rows == n
    assert torch.equal(ec.tables["t"].slab[:n], snapshot)
    ec.train()
    ec._pending = []
    # now creates the same rows, same values
    out_train = ec(ec.prepare_and_stage(_batch(seed=2, vocab=500)))
    torch.testing.assert_close(out_eval["a"], out_train["a"].detach(), rtol=0, atol=0)


def test_modulo_hashing_only_when_configured():
    batch = _batch(vocab=10_000)
    free = EmbeddingCollection([TableConfig(name="t", dim=4, features=["a", "b"])])
    fixed = EmbeddingCollection([TableConfig(name="t", dim=4, features=["a", "b"], hash_size=7)])
    free(free.prepare_and_stage(batch))
    fixed(fixed.prepare_and_stage(batch))
    assert fixed.tables["t"].num_rows <= 7
    assert free.tables["t"].num_rows == len(np.unique(batch.values.numpy()))


def test_slab_growth_keeps_trained_rows():
    tc = TableConfig(name="t", dim=4, features=["a"], num_embeddings=16)
    table = EmbeddingCollection([tc]).tables["t"]
    first = np.arange(10, dtype=np.int64)
    table.slab[torch.from_numpy(table.slots_for(first))] = 7.0  # "trained" rows
    table.slots_for(np.arange(5, 10_000, dtype=np.int64))  # grows the slab several times
    assert table.capacity >= 10_000
    assert torch.all(table.slab[torch.from_numpy(table.ids.lookup(first))] == 7.0)
    fresh = np.arange(10, 10_000, dtype=np.int64)
    rows = table.slab[torch.from_numpy(table.ids.lookup(fresh))]
    assert torch.equal(rows, torch.from_numpy(table.initial_rows(fresh)))


@pytest.mark.parametrize("device", DEVICES)
def test_tiered_collection_matches_resident_on_each_device(device):
    """Tiers through one forward path on any device: same pooled outputs and rows as resident.

    (The full bit-for-bit matrix with the trainer is tests/test_exactness.py.)"""
    from cosparse.store.types import TierPlan
    from cosparse.supply.placements import tiered_tables

    tc = TableConfig(name="t", dim=8, features=["a", "b"],
                     optimizer=OptimizerConfig(kind="rowwise_adagrad", lr=0.1))
    resident = EmbeddingCollection([tc], device=device)
    plans = {"t": TierPlan(device_rows=200, host_rows=400, spill=True)}
    tiered = EmbeddingCollection([tc], device, tiered_tables([tc], torch.device(device), plans))
    for step in range(12):
        batch = _batch(seed=step, vocab=300)
        outs = []
        for ec in (resident, tiered):
            pooled = ec(ec.prepare_and_stage(batch))
            out = torch.cat([pooled["a"], pooled["b"]])
            weight = torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out)
            (out * weight).sum().backward()
            ec.apply_gradients()
            outs.append(out.detach())
        assert torch.equal(outs[0], outs[1]), step
    a, b = resident.tables["t"].export(), tiered.tables["t"].export()
    order_a, order_b = np.argsort(a["ids"]), np.argsort(b["ids"])
    assert np.array_equal(a["ids"][order_a], b["ids"][order_b])
    assert np.array_equal(a["rows"][order_a], b["rows"][order_b])
    assert tiered.tables["t"].counters.evictions_device > 0


def test_slab_growth_on_the_planner_thread_loses_no_update():
    """The planner thread grows the slab while the trainer updates rows: no update is lost."""
    import threading

    tc = TableConfig(name="t", dim=4, features=["a"], num_embeddings=16,
                     optimizer=OptimizerConfig(kind="sgd", lr=1.0))
    table = EmbeddingCollection([tc]).tables["t"]
    hot = np.arange(8, dtype=np.int64)
    slots = table.slots_for(hot)
    stop = threading.Event()

    def grow_forever() -> None:
        start = 100
        while not stop.is_set():
            table.slots_for(np.arange(start, start + 2000, dtype=np.int64))
            start += 2000

    grower = threading.Thread(target=grow_forever)
    grower.start()
    try:
        for _ in range(300):
            w, s = table.gather(slots)
            table.apply_gradients(w, s, torch.ones(8, 4), slots, 1)  # each step: row -= 1
    finally:
        stop.set()
        grower.join()
    final = table.slab[torch.from_numpy(table.ids.lookup(hot)), :4]
    expect = torch.from_numpy(table.initial_rows(hot)[:, :4]) - 300
    assert table.capacity > 16 * 64  # it really grew many times meanwhile
    torch.testing.assert_close(final, expect, rtol=0, atol=1e-4)


def test_a_checkpoint_export_while_the_planner_thread_creates_rows_is_consistent():
    """Every ID an export returns has its row, initialised: the planner thread inserting IDs,
    growing the slab and initialising rows for batches ahead is one step to an export."""
    import threading

    tc = TableConfig(name="t", dim=4, features=["a"], num_embeddings=16)
    table = EmbeddingCollection([tc]).tables["t"]
    stop = threading.Event()

    def create() -> None:  # 300k rows in batches of 1,000, as a planner thread would
        for start in range(0, 300_000, 1000):
            if stop.is_set():
                return
            table.slots_for(np.arange(start, start + 1000, dtype=np.int64))

    creator = threading.Thread(target=create)
    creator.start()
    exports = 0
    try:
        while creator.is_alive():  # export again and again while the rows are being created
            out = table.export()
            exports += 1
            assert out["rows"].shape[0] == out["ids"].shape[0]
            assert np.array_equal(out["rows"], table.initial_rows(out["ids"]))  # never trained
    finally:
        stop.set()
        creator.join()
    assert exports > 0 and table.num_rows == 300_000


def test_an_unplanned_training_batch_is_refused_not_planned_behind_the_callers_back():
    ec = EmbeddingCollection([TableConfig(name="t", dim=4, features=["a", "b"])], device="cpu")
    ec.train()
    with pytest.raises(RuntimeError, match="must be planned before its forward"):
        ec(_batch(seed=1))
    assert ec.tables["t"].num_rows == 0  # nothing was planned or created
