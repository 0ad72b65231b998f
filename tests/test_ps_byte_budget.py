"""Issue 31 item 6: a shard's byte budget (``ps serve --max-bytes``, ``store.remote.max_bytes``).

``--max-rows`` counts rows, so a dim-4096 table could take about 2 TiB under the defaults. The
byte budget counts what every slot of a table's arrays costs (``row_bytes``: values, optimizer
state, version, flags, its share of the ID map): a REGISTER whose reserved rows do not fit, and
a request whose new rows would pass it, are refused (``full``), naming the shard, the budget and
the flag, with nothing applied. The real shard process: ``test_ps_fuzz.py``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from cosparse.config import OptimizerConfig, TableConfig
from cosparse.ps import limits
from cosparse.ps.limits import ShardError, ShardLimits
from cosparse.ps.shard import Shard
from cosparse.ps.shard_table import INITIAL_ROWS, row_bytes


def _cfg(name: str, dim: int, kind: str = "adam") -> TableConfig:
    return TableConfig(name=name, dim=dim, optimizer=OptimizerConfig(kind=kind, lr=0.01), seed=1)


def test_row_bytes_counts_values_state_version_flags_and_map():
    assert row_bytes(_cfg("t", 64, "sgd")) == 64 * 4 + 8 + 1 + 35
    assert row_bytes(_cfg("t", 64, "rowwise_adagrad")) == 65 * 4 + 8 + 1 + 35
    assert row_bytes(_cfg("t", 4096, "adam")) == 3 * 4096 * 4 + 8 + 1 + 35


def test_a_register_that_cannot_fit_is_refused_and_registers_nothing():
    budget = 64 << 20
    sh = Shard(0, 1, ShardLimits(max_bytes=budget))
    sh.register([_cfg("small", 8)])
    wide = _cfg("wide", 4096)  # 1024 reserved rows of 49,196 bytes: 50 MB
    with pytest.raises(ShardError, match=r"shard 0's byte budget is full: it holds \d+ of "
                                         rf"{budget} bytes, and registering 'default/wide', "
                                         r"'default/wide2' reserves .*nothing was registered "
                                         r"\(raise ps serve --max-bytes / store.remote.max_bytes") \
            as e:
        sh.register([wide, _cfg("wide2", 4096)])
    assert e.value.kind == "full" and sorted(sh.tables) == ["default/small"]
    sh.register([wide])  # one of them fits
    assert sh.stats()["bytes_held"] == INITIAL_ROWS * (row_bytes(wide) + row_bytes(_cfg("s", 8)))


@pytest.mark.parametrize("op", ["pull", "push", "push_rows"])
def test_growth_past_the_budget_is_refused_with_nothing_applied(op):
    cfg = _cfg("t", 64)
    budget = 5000 * row_bytes(cfg)
    sh = Shard(0, 1, ShardLimits(max_bytes=budget))
    sh.register([cfg])
    sh.pull("t", np.arange(4000, dtype=np.int64))
    held, wc = sh.bytes_held, sh.write_counter
    assert held <= budget and sh.table("t").capacity <= 5000  # grown within the budget
    ids = np.arange(3000, 6000, dtype=np.int64)  # 2000 new rows, 1000 fit
    with pytest.raises(ShardError, match=r"shard 0's byte budget is full: it holds \d+ of "
                                         rf"{budget} bytes \(table 't': {row_bytes(cfg)} bytes a "
                                         r"row\); table 't': 2000 new rows do not fit the 1000 "
                                         r"rows left; nothing was applied \(raise ps serve "
                                         r"--max-bytes / store.remote.max_bytes") as e:
        if op == "pull":
            sh.pull("t", ids)
        elif op == "push":
            sh.push("t", ids, np.ones((3000, 64), np.float32), 1)
        else:
            sh.push_rows("t", ids, np.ones((3000, 64 * 3), np.float32))
    assert e.value.kind == "full"
    assert sh.rows == 4000 and sh.write_counter == wc and sh.bytes_held <= budget
    sh.pull("t", ids[:2000])  # 1000 new rows: fit exactly
    assert sh.rows == 5000 and sh.bytes_held <= budget
    assert sh.stats()["bytes_held"] == sh.bytes_held
    assert sh.stats()["limits"]["max_bytes"] == budget


def test_a_restore_past_the_budget_is_refused(tmp_path):
    cfg = _cfg("t", 16)
    sh = Shard(0, 1)
    sh.register([cfg])
    sh.pull("t", np.arange(3000, dtype=np.int64))
    sh.snapshot(tmp_path)
    small = Shard(0, 1, ShardLimits(max_bytes=2000 * row_bytes(cfg)))
    with pytest.raises(ShardError, match="byte budget is full.*--max-bytes"):
        small.restore(tmp_path)


def test_the_default_budget_admits_the_benchmarks_and_refuses_a_2_tib_table(monkeypatch):
    pages = {"SC_PHYS_PAGES": (24 << 30) // 4096, "SC_PAGE_SIZE": 4096}  # this 24 GiB machine
    monkeypatch.setattr(os, "sysconf", lambda name: pages[name])
    assert limits.default_max_bytes() == 12 << 30
    # 8 tables of 1M rows at dim 64, Adam, over 2 shards: 4M rows a shard
    assert 4_000_000 * row_bytes(_cfg("t", 64)) < limits.default_max_bytes()
    # the row budget (2^27) of a dim-4096 Adam table: 6.6 TB, which the byte budget refuses
    assert ShardLimits().max_rows * row_bytes(_cfg("t", 4096)) > 500 * limits.default_max_bytes()
    with pytest.raises(ValueError, match=r"max_bytes \(ps serve --max-bytes\): must be a positive"):
        ShardLimits(max_bytes=0)
