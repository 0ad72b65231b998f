"""Spare rows ahead (cosparse.store.prefault): populating a slab's next rows never changes what
they hold, follows the used rows, and stops for a replaced slab."""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest
import torch

from cosparse.config import TableConfig
from cosparse.store import prefault
from cosparse.store.resident import ResidentTable

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="MADV_POPULATE_WRITE is Linux's")


@linux_only
def test_populate_keeps_contents() -> None:
    slab = np.arange(300_000 * 9, dtype=np.float32).reshape(300_000, 9)
    before = slab.copy()
    assert prefault.populate(slab.ctypes.data + 4 * 9 * 1000, 4 * 9 * 200_000)
    np.testing.assert_array_equal(slab, before)


@linux_only
def test_ahead_follows_used_rows_and_stops_when_closed() -> None:
    slab = np.zeros((1 << 16, 65), dtype=np.float32)
    spare = prefault.SpareRows(slab)
    spare.ahead(0, 0)  # at least MIN_AHEAD_BYTES
    least = prefault.MIN_AHEAD_BYTES // slab.strides[0]
    assert spare.frontier == least
    spare.ahead(100, 0)  # keeps the least distance ahead of the used rows
    assert spare.frontier == 100 + least
    spare.ahead(200, 20_000)  # twice the last insert, capped at the capacity
    assert spare.frontier == min(slab.shape[0], 200 + 40_000)
    spare.ahead(slab.shape[0] - 5, 20_000)
    assert spare.frontier == slab.shape[0]
    spare.close()
    spare.frontier = 0
    spare.ahead(100, 10)  # a replaced slab asks for nothing more
    assert spare.frontier == 0


def test_resident_rows_with_spare_rows_ahead() -> None:
    """A resident table's new rows read their initial values while later rows are populated
    behind them, through a growth of the slab."""
    cfg = TableConfig(name="t", dim=16, features=["f"], num_embeddings=100, seed=3)
    table = ResidentTable(cfg, torch.device("cpu"))
    rng = np.random.default_rng(0)
    for _ in range(5):
        ids = np.unique(rng.integers(0, 1 << 40, 5000))
        slots = table.slots_for(ids)
        np.testing.assert_array_equal(table.slab_array[slots], table.initial_rows(ids))
    deadline = time.monotonic() + 10
    while not prefault._jobs.empty() and time.monotonic() < deadline:
        time.sleep(0.01)
    exported = table.export()
    np.testing.assert_array_equal(exported["rows"], table.initial_rows(exported["ids"]))


@linux_only
def test_first_rows_of_a_budgeted_slab_are_asked_for_once(monkeypatch) -> None:
    monkeypatch.setattr(prefault, "FIRST_BYTES", 1 << 20)
    slab = np.zeros((1 << 15, 64), dtype=np.float32)
    spare = prefault.SpareRows(slab)
    spare.first(slab.shape[0])
    assert spare.frontier == (1 << 20) // slab.strides[0]  # at most FIRST_BYTES
    spare.first(10)
    assert spare.frontier == (1 << 20) // slab.strides[0]
