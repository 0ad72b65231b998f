"""The ID map, dedup and transposed index kernels against plain numpy references."""

import numpy as np
import pytest

from cosparse.store.dedup import Deduper
from cosparse.store.hashmap import IdMap


def test_idmap_insert_lookup_growth_unbounded_ids():
    rng = np.random.default_rng(0)
    m = IdMap(expected=16)
    ids = np.unique(rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, 50_000))
    rng.shuffle(ids)
    slots, first = m.lookup_or_insert(ids[:30_000])
    assert first == 0 and np.array_equal(slots, np.arange(30_000))
    assert m.capacity >= 30_000 / 0.7  # grew from 16
    slots2, first2 = m.lookup_or_insert(ids)  # half known, half new
    assert first2 == 30_000
    assert np.array_equal(slots2[:30_000], np.arange(30_000))
    assert np.array_equal(slots2[30_000:], np.arange(30_000, 50_000))
    found = m.lookup(np.r_[ids[::7], np.int64(12345)])
    assert np.array_equal(found[:-1], np.arange(50_000)[::7]) and found[-1] == -1
    k, s = m.items()
    m2 = IdMap.from_items(k, s)
    assert np.array_equal(m2.lookup(ids), np.arange(50_000))


def test_dedup_matches_numpy_and_keeps_first_occurrence_order():
    rng = np.random.default_rng(1)
    d = Deduper()
    for n in (0, 1, 1000, 70_000, 500):  # scratch is reused and shrinks/grows
        ids = rng.zipf(1.2, n).astype(np.int64) * -7919
        uniq, inv = d.unique(ids)
        assert np.array_equal(uniq[inv], ids)
        _, first_idx = np.unique(ids, return_index=True)
        assert np.array_equal(uniq, ids[np.sort(first_idx)])


@pytest.mark.parametrize("mean", [False, True])
def test_transposed_index_is_stable_and_complete(mean):
    rng = np.random.default_rng(2)
    lengths = rng.integers(0, 6, 300)
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int64)
    ids = rng.integers(0, 40, offsets[-1]).astype(np.int64)
    t = Deduper().prepare(ids, offsets, mean)
    bag_of = np.repeat(np.arange(lengths.shape[0]), lengths)
    for u in range(t.num_unique):
        occ = np.flatnonzero(t.inverse == u)  # occurrences in sample order
        got = t.t_bags[t.t_offsets[u] : t.t_offsets[u + 1]]
        assert np.array_equal(got, bag_of[occ])
        w = t.t_weights[t.t_offsets[u] : t.t_offsets[u + 1]]
        expect = 1.0 / lengths[bag_of[occ]] if mean else np.ones(occ.shape[0])
        np.testing.assert_array_equal(w, expect.astype(np.float32))


def test_idmap_erase_by_backward_shift_keeps_every_other_key_reachable():
    rng = np.random.default_rng(4)
    m = IdMap(expected=4096)
    ids = np.unique(rng.integers(-(2**62), 2**62, 3000))
    m.insert(ids, np.arange(ids.shape[0], dtype=np.int64) * 3)
    for _round in range(5):
        gone = rng.choice(ids, 400, replace=False)
        assert m.erase(gone) == 400
        assert m.erase(gone[:10]) == 0  # already gone
        keep = np.setdiff1d(ids, gone)
        assert np.all(m.lookup(gone) == -1)
        # every surviving key still maps to its slot (probe runs were repaired, no tombstones)
        expect = np.searchsorted(ids, keep) * 3
        assert np.array_equal(m.lookup(keep), expect)
        m.insert(gone, np.searchsorted(ids, gone).astype(np.int64) * 3)
    assert m.size == ids.shape[0] and int((m.vals >= 0).sum()) == ids.shape[0]


def test_future_uses_tag_the_latest_batch_in_the_horizon():
    """Each ID carries the tag of the latest batch that entered with it; an ID is needed while
    that tag is above the batches that left, through rebuilds that drop stale entries."""
    from cosparse.store.hashmap import IdMap
    from cosparse.store.tier import FutureUses

    rng = np.random.default_rng(5)
    f = FutureUses()
    dev = IdMap(expected=100)
    dev_ids = np.arange(0, 5000, 50, dtype=np.int64)
    dev.insert(dev_ids, np.arange(dev_ids.shape[0], dtype=np.int64))
    wanted = np.zeros(dev_ids.shape[0], dtype=np.int32)
    batches = [np.unique(rng.integers(0, 5000 + 2000 * i, 3000)) for i in range(12)]
    horizon = 4
    for i, b in enumerate(batches):
        if i >= horizon:
            f.leave()
        f.enter(b, dev, wanted)  # grows and rebuilds on the way
        window = batches[max(0, i - horizon + 1) : i + 1]
        needed = np.unique(np.concatenate(window))
        probe = np.arange(0, 5000 + 2000 * i, dtype=np.int64)
        assert np.array_equal(f.get(probe) > f.left, np.isin(probe, needed)), i
        assert np.array_equal(wanted > f.left, np.isin(dev_ids, needed)), i
        latest = np.zeros(probe.shape[0], dtype=np.int64)
        for k, w in enumerate(batches[: i + 1]):
            latest[np.isin(probe, w)] = k + 1
        live = latest > f.left  # a stale tag may be gone after a rebuild, never a live one
        got = f.get(probe)
        assert np.array_equal(got[live], latest[live]) and np.all(got[~live] <= f.left), i
    assert f.size <= 0.7 * f.keys.shape[0] and f.left == len(batches) - horizon


def test_wanted_marks_match_the_horizon_after_planning():
    """Per device slot, ``wanted`` is above the batches that left exactly when a batch in the
    horizon needs the row, kept through fetches, evictions and batches leaving the horizon."""
    import torch

    from cosparse.config import TableConfig
    from cosparse.store.tiered import TieredTable

    rng = np.random.default_rng(6)
    table = TieredTable(TableConfig(name="t", dim=4, features=["a"]), torch.device("cpu"),
                        device_rows=300, host_rows=None, spill=False)
    batches = [np.unique(rng.zipf(1.3, 120) % 1000).astype(np.int64) for _ in range(30)]
    horizon = 5
    for b in batches[:horizon]:
        table.observe_future(b, +1)
    for seq, b in enumerate(batches):
        table.observe_future(b, -1)
        table.fill(table.plan(b, seq, lambda: False), table.row_sources(None))
        table.release(seq)
        if seq + horizon < len(batches):
            table.observe_future(batches[seq + horizon], +1)
        window = batches[seq + 1 : seq + 1 + horizon]
        dev = table.dev
        occ = dev.occupied_slots()
        expect = np.zeros(occ.shape[0], dtype=np.bool_)
        for w in window:
            expect |= np.isin(dev.slot_ids[occ], w)
        assert np.array_equal(dev.wanted[occ] > dev.future.left, expect), seq
