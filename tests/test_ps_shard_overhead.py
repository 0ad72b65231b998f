"""``ShardTable.overhead_bytes``: the bytes a PS shard's table holds beyond its rows and their
optimizer state (ID->slot map, per-slot IDs, versions and flags, request scratch), from the live arrays,
and the per-table figure in the shard's STATS."""

from __future__ import annotations

import numpy as np

from cosparse.config import OptimizerConfig, TableConfig
from cosparse.ps.shard import Shard
from cosparse.ps.shard_table import ShardTable

CFG = TableConfig("rwa", dim=8, optimizer=OptimizerConfig(kind="rowwise_adagrad", lr=0.05), seed=2)

# every array a ShardTable holds beside the slab, as the structures are today
EXPECTED = ("map.keys", "map.vals", "versions", "flags", "slots", "marks", "new_ids")


def _expected_bytes(t: ShardTable) -> int:
    """The same sum, written out by hand from the structures."""
    arrays = [t.keys, t.vals, t.versions, t.flags, t._slots, t._marks, t._new_ids]
    return sum(int(a.nbytes) for a in arrays)


def test_overhead_counts_every_metadata_array_and_not_the_slab() -> None:
    t = ShardTable(CFG)
    t.slots(np.arange(100, dtype=np.int64) * 7919)
    parts = t.overhead_nbytes()
    assert set(EXPECTED) <= set(parts), sorted(set(EXPECTED) - set(parts))
    assert not any("slab" in k for k in parts)
    assert t.overhead_bytes() == sum(parts.values()) == _expected_bytes(t)
    assert t.slab_bytes() == t.capacity * t.width * 4
    # the slab holds (dim + row-wise Adagrad's 1 state) floats per slot, beside the overhead
    assert t.width == 9 and t.slab_bytes() == t.slab.nbytes


def test_overhead_grows_with_the_rows_and_is_per_row_bounded() -> None:
    t = ShardTable(CFG)
    t.slots(np.arange(10, dtype=np.int64))
    small = t.overhead_bytes()
    ids = np.random.default_rng(0).choice(1 << 40, size=20_000, replace=False).astype(np.int64)
    t.slots(ids)
    assert t.rows == 20_010
    big = t.overhead_bytes()
    assert big > small
    assert big == _expected_bytes(t)
    per_row = big / t.rows
    # at least the map's 12 B per entry and the 8 B version; far below a row of 9 floats x 1000
    assert 20 < per_row < 1000, per_row


def test_shard_stats_report_each_tables_overhead() -> None:
    sh = Shard(0, 1)
    sh.register([CFG])
    sh.pull("rwa", np.arange(50, dtype=np.int64))
    st = sh.stats()["tables"]["default/rwa"]
    t = sh.table("rwa")
    assert st["rows"] == 50
    assert st["overhead_bytes"] == t.overhead_bytes() > 0
    assert st["slab_bytes"] == t.slab_bytes() >= st["bytes"]
