"""TieredTable.memory_overhead: the bytes a tiered table keeps beyond its rows and their optimizer
state, checked against the arrays it is made of, through real plans, fills, evictions and growth."""

from __future__ import annotations

import numpy as np
import torch

from cosparse.config import TableConfig
from cosparse.store.tier import Tier
from cosparse.store.tiered import TieredTable

KINDS = {"id_map", "slot_maps", "flags", "hotness", "horizon", "in_flight", "total", "live_rows"}


def _by_hand(tier: Tier) -> int:
    """Every metadata array of a tier, listed independently of ``Tier.metadata_nbytes``."""
    arrays = (tier.map.keys, tier.map.vals, tier.slot_ids, tier.free, tier.retired, tier.occupied,
              tier.dirty, tier.pins, tier.counts, tier.last, tier.wanted, tier.future.keys,
              tier.future.vals)
    return sum(a.nbytes for a in arrays)


def _run(table: TieredTable, batches: list[np.ndarray], horizon: int, keep_last: bool = False) -> None:
    for b in batches[:horizon]:
        table.observe_future(b, +1)
    for seq, b in enumerate(batches):
        table.observe_future(b, -1)
        table.fill(table.plan(b, seq, lambda: False), table.row_sources(None))
        if not (keep_last and seq == len(batches) - 1):
            table.release(seq)
        if seq + horizon < len(batches):
            table.observe_future(batches[seq + horizon], +1)


def _batches(seed: int, n: int, size: int, vocab: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.unique(rng.zipf(1.2, size) % vocab).astype(np.int64) for _ in range(n)]


def test_overhead_sums_every_tier_and_counts_each_row_once():
    cfg = TableConfig(name="t", dim=4, features=["a"])
    table = TieredTable(cfg, torch.device("cpu"), device_rows=200, host_rows=300, spill=True)
    batches = _batches(3, 40, 150, 5000)
    _run(table, batches, horizon=4)
    m = table.memory_overhead()
    assert set(m) == KINDS
    tiers = table.local_tiers()
    assert [t.name for t in tiers] == ["device", "host", "backing"]
    assert m["in_flight"] == 0  # every batch released
    assert m["total"] == sum(_by_hand(t) for t in tiers)
    assert m["total"] == sum(v for k, v in m.items() if k not in ("total", "live_rows"))
    assert m["id_map"] == sum(t.map.keys.nbytes + t.map.vals.nbytes for t in tiers)
    # shadows (a row on the device and the host) count once: the live rows are the table's rows
    seen = np.unique(np.concatenate(batches))
    assert m["live_rows"] == seen.shape[0] == table.num_rows
    assert sum(t.size for t in tiers) > m["live_rows"]  # there are shadows to count once
    per_row = m["total"] / m["live_rows"]
    assert 8 + 4 + 8 < per_row < 500


def test_overhead_follows_growth_and_pins_in_flight():
    cfg = TableConfig(name="t", dim=4, features=["a"])
    table = TieredTable(cfg, torch.device("cpu"), device_rows=100, host_rows=None, spill=False)
    _run(table, _batches(4, 5, 60, 400), horizon=2)
    small = table.memory_overhead()
    assert table.backing is None and len(table.local_tiers()) == 2
    _run(table, _batches(5, 40, 80, 100_000), horizon=2, keep_last=True)  # the host grows
    big = table.memory_overhead()
    assert big["live_rows"] > small["live_rows"]
    assert big["id_map"] > small["id_map"] and big["slot_maps"] > small["slot_maps"]
    assert big["in_flight"] == sum(s.nbytes for s in table._pinned.values()) > 0
    assert big["total"] == sum(_by_hand(t) for t in table.local_tiers()) + big["in_flight"]
