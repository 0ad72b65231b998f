"""Architecture A under adversarial timing: bit-identical to the all-resident engine, every time.

The workload is built to make stale reads likely: two tiny tables (a few dozen rows each) and
small batches, so nearly every row of a batch was also in the previous one; lookahead 1, so a
batch is planned (its rows pulled) while the previous one is still training and pushing; two real
shard processes; many short runs. Both architecture A placements (rows pulled every step, and the
written-through device cache) run with the trainer's and the shards' numba thread counts at 1 and
2, each with the stale-read check on (``check_versions``): a row read before a write landed stops
the run at once, naming it, and every loss and every final row (with its optimizer state) must
equal the all-resident run's bit for bit.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import numba
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cosparse.batch import SparseBatch
from cosparse.config import OptimizerConfig, TableConfig
from cosparse.nn.embedding import EmbeddingCollection
from cosparse.ps import EmbeddedShards
from cosparse.ps.client import PSClient
from cosparse.store.types import TierPlan
from cosparse.supply.placements import ps_tables
from cosparse.supply.versions import StaleRowError
from cosparse.train.prefetch import Prefetcher

CPU = torch.device("cpu")

HOT, VOCAB = 12, 40  # rows per table: IDs < HOT are in nearly every batch, the rest come and go
BATCH = 12
STEPS = 40
REPEATS = 3
FEATURES = ("a", "b")


@contextlib.contextmanager
def _shards(tmp: str, numba_threads: int) -> Iterator[EmbeddedShards]:
    """Two embedded shard processes whose numba kernels run on ``numba_threads`` threads."""
    old = os.environ.get("NUMBA_NUM_THREADS")
    os.environ["NUMBA_NUM_THREADS"] = str(numba_threads)
    try:
        shards = EmbeddedShards(2, data_dir=tmp)
    finally:
        if old is None:
            os.environ.pop("NUMBA_NUM_THREADS", None)
        else:
            os.environ["NUMBA_NUM_THREADS"] = old
    try:
        yield shards
    finally:
        shards.close()


@pytest.fixture(scope="module")
def shard_sets(tmp_path_factory) -> Iterator[dict[int, EmbeddedShards]]:
    """One pair of shard processes per shard thread count, shared by the module's tests (each
    test registers tables of its own)."""
    with contextlib.ExitStack() as stack:
        out = {n: stack.enter_context(_shards(str(tmp_path_factory.mktemp(f"ps{n}")), n))
               for n in (1, 2)}
        yield out


@contextlib.contextmanager
def _trainer_threads(n: int) -> Iterator[None]:
    old_numba, old_torch = numba.get_num_threads(), torch.get_num_threads()
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    torch.set_num_threads(n)
    try:
        yield
    finally:
        numba.set_num_threads(old_numba)
        torch.set_num_threads(old_torch)


def _tables(prefix: str, optimizer: str) -> list[TableConfig]:
    return [TableConfig(name=f"{prefix}_{f}", dim=8, features=[f], pooling=pool, seed=3 + i,
                        optimizer=OptimizerConfig(kind=optimizer, lr=0.3))
            for i, (f, pool) in enumerate(zip(FEATURES, ("sum", "mean"), strict=True))]


def _batches(seed: int) -> list[SparseBatch]:
    """Tiny-vocabulary batches: consecutive batches share most rows, a few rows come and go."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(STEPS):
        lengths = rng.integers(1, 4, size=len(FEATURES) * BATCH)
        hot = rng.integers(0, HOT, size=int(lengths.sum()))
        cold = rng.integers(HOT, VOCAB, size=hot.shape[0])
        ids = np.where(rng.random(hot.shape[0]) < 0.7, hot, cold)
        out.append(SparseBatch(list(FEATURES), torch.from_numpy(ids), torch.from_numpy(lengths),
                               torch.zeros(BATCH, 1),
                               torch.from_numpy((rng.random(BATCH) < 0.5).astype(np.float32)),
                               index=i))
    return out


def _most_rows_of_one_batch(batches: list[SparseBatch]) -> int:
    return max(int(np.unique(b.feature(f)[0].numpy()).shape[0]) for b in batches for f in FEATURES)


def _train(ec: EmbeddingCollection, batches: list[SparseBatch]) -> list[float]:
    """The trainer's loop: one Prefetcher over ``ec.staged``, forward, backward, dense step,
    ``apply_gradients`` (the push)."""
    torch.manual_seed(0)
    head = torch.nn.Linear(8 * len(FEATURES), 1)
    opt = torch.optim.SGD(head.parameters(), lr=0.1)
    ec.train()
    prefetch = Prefetcher(ec.staged(iter(batches), 0), lambda p: p, 1)
    losses = []
    try:
        for p in prefetch:
            opt.zero_grad()
            emb = ec(p)
            x = torch.cat([emb[f] for f in FEATURES], dim=1)
            loss = F.binary_cross_entropy_with_logits(head(x).squeeze(1), p.batch.labels)
            loss.backward()
            opt.step()
            ec.apply_gradients()
            losses.append(float(loss.detach()))
    finally:
        ec.planner.cancel()
        prefetch.close()
    return losses


def _ps_rows(client: PSClient, name: str) -> tuple[np.ndarray, np.ndarray]:
    ids, rows = client.dump(name)
    order = np.argsort(ids)
    return ids[order], rows[order]


def _resident_rows(ec: EmbeddingCollection, name: str) -> tuple[np.ndarray, np.ndarray]:
    state = ec.tables[name].export()
    order = np.argsort(state["ids"])
    return state["ids"][order], state["rows"][order]


@pytest.mark.parametrize("shard_threads", [1, 2])
@pytest.mark.parametrize("trainer_threads", [1, 2])
@pytest.mark.parametrize("placement", ["direct", "cached"])
def test_arch_a_is_bit_identical_under_heavy_reuse(shard_sets, request, placement,
                                                   trainer_threads, shard_threads):
    shards = shard_sets[shard_threads]
    optimizer = {"direct": "rowwise_adagrad", "cached": "adam"}[placement]
    with shards.client() as client, _trainer_threads(trainer_threads):
        for rep in range(REPEATS):
            prefix = f"{placement}{trainer_threads}{shard_threads}r{rep}"
            tables = _tables(prefix, optimizer)
            batches = _batches(seed=1000 * trainer_threads + 100 * shard_threads + rep)
            ref_ec = EmbeddingCollection(tables, "cpu")
            ref = _train(ref_ec, batches)
            client.register(tables)
            # the cache holds a little more than one batch's rows: hits, misses and victims
            tiers = None
            if placement == "cached":
                tiers = {t.name: TierPlan(_most_rows_of_one_batch(batches) + 2) for t in tables}
            placements = ps_tables(tables, CPU, client, 1, tiers, check_versions=True)
            ec = EmbeddingCollection(tables, "cpu", placements, lookahead=1)
            assert sum(t.check_versions for t in ec.tables.values()) == len(tables)
            got = _train(ec, batches)
            bad = [i for i, (a, b) in enumerate(zip(got, ref, strict=True)) if a != b]
            assert not bad, (f"{request.node.name} repeat {rep}: loss differs first at step "
                             f"{bad[0] + 1}: {got[bad[0]]!r} vs {ref[bad[0]]!r}")
            for t in tables:
                gids, grows = _ps_rows(client, t.name)
                rids, rrows = _resident_rows(ref_ec, t.name)
                assert np.array_equal(gids, rids), f"table '{t.name}': different row IDs"
                diff = np.flatnonzero((grows != rrows).any(axis=1))
                assert diff.shape[0] == 0, (f"table '{t.name}': {diff.shape[0]} final rows differ, "
                                            f"e.g. ID {gids[diff[0]]}")
            if placement == "cached":  # the cache really hit, missed and dropped victims
                counters = ec.counters()
                assert sum(c.device_hits for c in counters.values()) > 0
                assert sum(c.evictions_device for c in counters.values()) > 0
            else:  # rows of the batch in flight really were deferred
                assert sum(t.deferred_rows for t in ec.tables.values()) > 0


def _one_batch(ids: list[int], index: int) -> SparseBatch:
    v = np.asarray(ids, dtype=np.int64)
    return SparseBatch(["a"], torch.from_numpy(v), torch.ones(v.shape[0], dtype=torch.int64),
                       torch.zeros(v.shape[0], 1), torch.zeros(v.shape[0]), index=index)


@pytest.mark.parametrize("placement", ["direct", "cached"])
def test_check_versions_catches_a_row_written_behind_the_trainers_back(shard_sets, placement):
    """A second real client pushes to a row of the next batch after the trainer read it: the
    check stops that batch before it trains, naming the table, the ID and both versions."""
    shards = shard_sets[1]
    table = TableConfig(name=f"behind_{placement}", dim=4, features=["a"],
                        optimizer=OptimizerConfig(kind="sgd", lr=0.1))
    with shards.client() as client, shards.client() as other:
        client.register([table])
        tiers = {table.name: TierPlan(16)} if placement == "cached" else None
        placements = ps_tables([table], CPU, client, 1, tiers, check_versions=True)
        ec = EmbeddingCollection([table], "cpu", placements, lookahead=1)
        assert sum(t.check_versions for t in ec.tables.values()) == 1
        ec.train()
        b0, b1 = ec.prepare(_one_batch([1, 2, 3], 0)), ec.prepare(_one_batch([3, 4, 5], 1))
        ec.stage(b0)
        ec.stage(b1)  # lookahead 1: rows 4 and 5 are read now, row 3 once b0 has trained
        ec(b0)["a"].sum().backward()
        ec.apply_gradients()
        # b1 is planned and its row 5 read: now write row 5 behind the trainer's back
        other.push(table.name, np.array([5], np.int64), np.ones((1, 4), np.float32), step=1)
        with pytest.raises(StaleRowError) as err:
            ec(b1)
    e = err.value
    assert (e.table, e.id, e.count) == (table.name, 5, 1)
    assert e.ps_version == e.used_version + 1
    assert f"table '{table.name}'" in str(e) and "ID 5" in str(e)
    assert f"used version {e.used_version}, the PS holds version {e.ps_version}" in str(e)
