"""Admission (rows only after k sightings) and TTL (unused rows dropped from every tier).

Both change results by design, so they are off by default and outside the exactness matrix.
"""

import numpy as np
import torch

from cosparse.batch import SparseBatch
from cosparse.config import OptimizerConfig, TableConfig
from cosparse.nn.embedding import EmbeddingCollection
from cosparse.store.types import TierPlan
from cosparse.supply.placements import tiered_tables


def _batch(ids):
    ids = torch.tensor(ids, dtype=torch.int64)
    return SparseBatch(["a"], ids, torch.ones(ids.numel(), dtype=torch.int64),
                       torch.zeros(ids.numel(), 1), torch.zeros(ids.numel()))


def _train_step(ec, batch):
    out = ec(ec.prepare_and_stage(batch))["a"]
    out.sum().backward()
    ec.apply_gradients()
    return out.detach()


def test_admission_reads_the_default_row_until_k_sightings():
    tc = TableConfig(name="t", dim=4, features=["a"], optimizer=OptimizerConfig(kind="sgd", lr=1.0))
    for tiers in (None, {"t": TierPlan(device_rows=8)}):
        placements = None if tiers is None else tiered_tables([tc], torch.device("cpu"), tiers)
        ec = EmbeddingCollection([tc], "cpu", placements, admit_after=3)
        table = ec.tables["t"]
        for sighting in (1, 2):
            out = _train_step(ec, _batch([7, 8]))
            assert torch.equal(out, torch.zeros(2, 4)), sighting  # default row, trains nothing
        assert table.export()["ids"].shape[0] == 0  # no row was created
        out = _train_step(ec, _batch([7, 9]))  # 7: third sighting -> admitted; 9: first
        assert torch.equal(out[0], torch.from_numpy(table.initial_rows(np.array([7]))[0, :4]))
        assert torch.equal(out[1], torch.zeros(4))
        exported = table.export()
        assert exported["ids"].tolist() == [7]
        # the admitted row trained (sgd, lr 1, upstream grad 1): initial - 1
        initial = table.initial_rows(np.array([7]))[0, :4]
        np.testing.assert_array_equal(exported["rows"][0, :4], initial - 1)
        assert ec.admission["t"].rejected == 2 + 2 + 1


def test_ttl_drops_untouched_rows_from_every_tier():
    tc = TableConfig(name="t", dim=4, features=["a"], optimizer=OptimizerConfig(kind="sgd", lr=0.5))
    plans = {"t": TierPlan(device_rows=4, host_rows=8, spill=True, ttl_steps=4)}
    ec = EmbeddingCollection([tc], "cpu", tiered_tables([tc], torch.device("cpu"), plans))
    table = ec.tables["t"]
    _train_step(ec, _batch([1, 2, 3, 4]))
    _train_step(ec, _batch([5, 6, 7, 8]))  # 1..4 written down to the host
    for _ in range(8):
        _train_step(ec, _batch([5, 6]))  # keeps 5, 6 fresh; the rest age out
    ids = set(table.export()["ids"].tolist())
    assert {5, 6} <= ids
    assert not ids & {1, 2, 3, 4, 7, 8}
    assert table.counters.ttl_drops == 6
    for tier in (table.dev, table.host, table.backing):
        assert not set(tier.slot_ids[tier.occupied_slots()].tolist()) & {1, 2, 3, 4, 7, 8}
    # a dropped ID that comes back starts again from its initial value
    out = _train_step(ec, _batch([1]))
    assert torch.equal(out[0], torch.from_numpy(table.initial_rows(np.array([1]))[0, :4]))
