"""Mixed negatives (issue 36, item 2): ``data.events.uniform_negatives`` draws k items per
sample uniformly from the training split's items, as features ``neg{j}_<key>`` in their item's
table; the retrieval loss adds them as columns with the mixture's logQ correction
``log(p_j + k / items)``. The draws depend on (seed, split, batch index) alone. Placements and
ranks are checked by the two-tower and SASRec tests, which train with them."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cosparse.config import ConfigError, config_from_mapping
from cosparse.data.uniform_negatives import negatives_of
from cosparse.nn.retrieval import ItemFrequency, Retrieval
from cosparse.parallel.loss import retrieval_loss
from cosparse.train.inputs import model_inputs
from tests.test_two_tower import MOVIELENS, mapping

ROOT = Path(__file__).resolve().parents[1]


def test_the_loss_scores_every_user_against_the_drawn_items_with_the_mixtures_correction():
    torch.manual_seed(0)
    b, k, pool = 3, 2, 50
    users = F.normalize(torch.randn(b, 4), dim=1)
    items = F.normalize(torch.randn(b, 4), dim=1)
    negatives = F.normalize(torch.randn(b * k, 4), dim=1)
    ids = torch.tensor([7, 8, 9])
    negative_ids = torch.tensor([1, 7, 2, 3, 9, 4])  # (7 is sample 0's item: not its negative)
    freq = ItemFrequency(bits=8)
    freq.observe(torch.tensor([7, 7, 8, 9, 1]))
    out = Retrieval(users, items, ids, freq, negatives, negative_ids)
    got = retrieval_loss(out, 0.1, None, None, observe=True, negative_pool=pool)
    columns = torch.cat([items, negatives])
    column_ids = torch.cat([ids, negative_ids]).tolist()
    counts = {7: 2, 8: 1, 9: 1, 1: 1}
    for i in ids.tolist():
        counts[i] += 1  # (the batch's own items, counted by this step)
    total = 5 + b
    want = 0.0
    def logit(s: int, j: int) -> float:
        share = max(counts.get(column_ids[j], 0), 1) / total + k / pool
        return float(users[s] @ columns[j]) / 0.1 - math.log(share)
    for s in range(b):
        kept = [logit(s, j) for j in range(len(column_ids))
                if j == s or column_ids[j] != column_ids[s]]
        want += math.log(sum(math.exp(z) for z in kept)) - logit(s, s)
    assert float(got) == pytest.approx(want, rel=1e-5)
    with pytest.raises(ValueError, match="SparseBatch.negative_pool"):
        retrieval_loss(out, 0.1, None, None, observe=False, negative_pool=0)


def test_negative_features_pair_with_the_items_features_in_order():
    feats = ["user", "item", "cate", "hist_item", "neg0_item", "neg0_cate", "neg1_item",
             "neg1_cate"]
    assert negatives_of(feats, ["item", "cate"]) == [["neg0_item", "neg0_cate"],
                                                     ["neg1_item", "neg1_cate"]]
    assert negatives_of(feats[:5], ["item", "cate"]) == []


def _mapping(k: int) -> dict:
    raw = mapping(steps=2, batch=64)
    raw["data"]["events"]["uniform_negatives"] = k
    return raw


@pytest.mark.skipif(not MOVIELENS.exists(), reason=f"{MOVIELENS} is absent")
def test_the_reader_draws_training_items_by_seed_split_and_batch_and_tables_take_them():
    inputs = model_inputs(config_from_mapping(_mapping(2)))
    train, eval_ = inputs.train, inputs.eval
    assert train.keys[-2:] == ["neg0_item", "neg1_item"] == eval_.keys[-2:]
    assert inputs.cfg.tables[0].features[-2:] == ["neg0_item", "neg1_item"]
    tasks = list(train.tasks())
    first, again = train.build(tasks[0]), train.build(tasks[0])
    other = train.build(tasks[1])
    drawn = first.feature("neg0_item")[0]
    assert torch.equal(drawn, again.feature("neg0_item")[0])  # (a function of the batch)
    assert not torch.equal(drawn, other.feature("neg0_item")[0])
    assert not torch.equal(drawn, first.feature("neg1_item")[0])
    assert not torch.equal(drawn, eval_.build(next(iter(eval_.tasks()))).feature("neg0_item")[0])
    train_items = np.unique(train.log.item[train.in_train])
    assert first.negative_pool == len(train_items)
    every = np.concatenate([train.build(t).feature(f"neg{j}_item")[0].numpy()
                            for t in tasks[:200] for j in range(2)])
    assert np.isin(every, train_items).all()
    # uniform: each of the ~1,680 items drawn ~15 times; no item far above that
    counts = np.bincount(np.searchsorted(train_items, every), minlength=len(train_items))
    assert counts.max() < 4 * every.shape[0] / len(train_items)
    assert model_inputs(config_from_mapping(_mapping(0))).train.keys == train.keys[:-2]


def test_the_config_rules_name_the_key():
    raw = _mapping(1)
    raw["model"] = {"kind": "din"}
    del raw["objective"]
    with pytest.raises(ConfigError, match=r"data\.events\.uniform_negatives: mixed negatives "
                                          r"are a retrieval model's"):
        config_from_mapping(copy.deepcopy(raw))
    raw = _mapping(-1)
    with pytest.raises(ConfigError, match=r"data\.events\.uniform_negatives"):
        config_from_mapping(raw)
