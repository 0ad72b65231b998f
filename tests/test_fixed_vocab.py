"""``tables[i].vocab: fixed``: an all-resident table without an ID map, its ``hash_size`` rows
created at start-up, trains the dynamic vocabulary's numbers bit for bit, on every placement, and
its checkpoints load either way."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from cosparse.config import ConfigError, TableConfig, validate
from cosparse.store.all_resident import resident_table
from cosparse.store.fixed_vocab import FixedVocabTable
from cosparse.store.resident import BudgetExceeded, ResidentTable
from cosparse.train.trainer import Trainer
from tests.exactness import base_config, first_difference, run, tiered

ROWS = 4093  # fewer rows than the synthetic vocabulary: the modulo folds IDs together


def _config(vocab: str):
    cfg = base_config("zipf", "rowwise_adagrad")
    for t in cfg.tables:
        t.hash_size, t.vocab = ROWS, vocab
    return cfg


@pytest.fixture(scope="module")
def dynamic():
    return run(_config("dynamic"))


def test_fixed_table_is_created_whole_and_maps_ids_to_their_own_slot() -> None:
    cfg = TableConfig(name="t", dim=8, features=["f"], hash_size=1000, vocab="fixed", seed=5)
    table = resident_table(cfg, torch.device("cpu"))
    assert isinstance(table, FixedVocabTable) and table.capacity == 1000 and table.num_rows == 0
    ids = np.arange(1000)
    np.testing.assert_array_equal(table.slab_array, ResidentTable(cfg, torch.device("cpu"))
                                  .initial_rows(ids))
    np.testing.assert_array_equal(table.slots_for(np.array([7, 3, 999])), [7, 3, 999])
    assert table.num_rows == 3
    np.testing.assert_array_equal(table.export()["ids"], [3, 7, 999])  # the touched rows
    with pytest.raises(ValueError, match="row key 1000 is outside 0 .. 999"):
        table.slots_for(np.array([1000]))
    with pytest.raises(BudgetExceeded, match="hash_size 1000 rows"):
        FixedVocabTable(cfg, torch.device("cpu"), max_bytes=1000)


def test_fixed_vocab_needs_hash_size() -> None:
    cfg = _config("fixed")
    cfg.tables[0].hash_size = None
    with pytest.raises(ConfigError, match=r"tables\[0\].vocab: 'fixed' .* hash_size"):
        validate(cfg)


def test_fixed_vocab_trains_the_dynamic_numbers(dynamic) -> None:
    got = run(_config("fixed"))
    assert all(isinstance(t, FixedVocabTable) for t in got.trainer.ec.tables.values())
    assert first_difference(got, dynamic) is None


def test_fixed_vocab_on_tiers_keeps_the_maps_and_the_numbers(dynamic) -> None:
    got = run(tiered(_config("fixed"), device_rows=2000, lookahead=2, workers=0, policy="lru"))
    assert not any(isinstance(t, FixedVocabTable) for t in got.trainer.ec.tables.values())
    assert first_difference(got, dynamic) is None


@pytest.mark.parametrize("first,then", [("fixed", "fixed"), ("dynamic", "fixed"),
                                        ("fixed", "dynamic")])
def test_checkpoints_load_either_way(first, then, dynamic, tmp_path) -> None:
    cfg = validate(copy.deepcopy(_config(first)))
    cfg.train.checkpoint.dir, cfg.train.checkpoint.every = str(tmp_path), 75
    before = Trainer(cfg, log=lambda m: None)
    before.run(steps=75)
    before.close()
    cfg = validate(copy.deepcopy(_config(then)))
    after = Trainer(cfg, log=lambda m: None)
    after.resume(str(tmp_path))
    after.run()
    rows = {}
    for name, state in after.ec.export_rows().items():
        order = np.argsort(state["ids"])
        rows[name] = (state["ids"][order], state["rows"][order])
    after.close()
    assert before.losses + after.losses == dynamic.losses
    for name, (ids, values) in dynamic.rows.items():
        np.testing.assert_array_equal(rows[name][0], ids)
        np.testing.assert_array_equal(rows[name][1], values)
