"""Two-tower retrieval (issue 36, item 2): the in-batch sampled softmax with its logQ correction
and duplicates left out, the streaming frequency estimate, the exact full-corpus ranking
metrics, and ``model.kind: two_tower`` from config alone on MovieLens-100k (leave-last-out),
bit-identical on every placement, the same numbers from Python, and its config rules."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

import cosparse
from cosparse.api.factory import make_trainer
from cosparse.cli import main
from cosparse.config import ConfigError, config_from_mapping
from cosparse.models import two_tower
from cosparse.nn.retrieval import ItemFrequency, in_batch_softmax
from cosparse.serving import load
from cosparse.train.retrieval_eval import ranking_metrics, target_ranks
from tests.torchrun import run_ranks

ROOT = Path(__file__).resolve().parents[1]
MOVIELENS = ROOT.parent / "shared/data/movielens-100k/u.data"


def test_the_in_batch_softmax_is_the_cross_entropy_of_corrected_scores_without_duplicates():
    torch.manual_seed(0)
    users, items = F.normalize(torch.randn(4, 3), dim=1), F.normalize(torch.randn(4, 3), dim=1)
    ids = torch.tensor([7, 8, 7, 9])
    log_q = torch.log(torch.tensor([0.5, 0.2, 0.5, 0.3]))
    got = in_batch_softmax(users, ids, items, ids, 0, log_q, 0.1)
    want = 0.0
    for i in range(4):
        logits = [float(users[i] @ items[j]) / 0.1 - float(log_q[j]) for j in range(4)
                  if j == i or ids[j] != ids[i]]  # (sample i's own item, and other items)
        own = float(users[i] @ items[i]) / 0.1 - float(log_q[i])
        want += math.log(sum(math.exp(z) for z in logits)) - own
    assert float(got) == pytest.approx(want, rel=1e-5)


def test_the_frequency_estimate_counts_the_stream_and_never_undercounts():
    f = ItemFrequency(bits=4, depth=2)  # (16 counters a row: collisions)
    ids = torch.tensor([1, 1, 1, 2, 3, 1000, 5000, 70000])
    f.observe(ids)
    f.observe(torch.tensor([1, 2]))
    counts = torch.exp(f.log_q(torch.tensor([1, 2, 3]))) * 10
    assert counts.round().tolist()[0] >= 4 and counts[0] > counts[2]
    assert (counts.round() >= torch.tensor([4.0, 2.0, 1.0])).all() and int(f.total) == 10
    again = ItemFrequency(bits=4, depth=2)
    again.observe(ids)
    again.observe(torch.tensor([1, 2]))
    assert torch.equal(again.counts, f.counts)  # (deterministic: counters of a state dict)


def test_a_target_rank_leaves_out_the_seen_items_and_breaks_ties_by_corpus_order():
    scores = torch.tensor([[0.9, 0.5, 0.7, 0.5, 0.1],
                           [0.2, 0.2, 0.2, 0.2, 0.2]])
    targets = torch.tensor([3, 2])
    # row 0 has seen column 0 (left out) and its own target 3 (never left out)
    ranks = target_ranks(scores, targets, torch.tensor([0, 0]), torch.tensor([0, 3]))
    assert ranks.tolist() == [2, 2]  # row 0: 0.7 and the tie at column 1; row 1: columns 0, 1
    m = ranking_metrics(np.array([0, 9, 10, 99]))
    assert m["recall@10"] == 0.5
    assert m["ndcg@10"] == pytest.approx((1 + 1 / math.log2(11)) / 4)
    assert m["mrr"] == pytest.approx((1 + 1 / 10 + 1 / 11 + 1 / 100) / 4)


def mapping(steps: int = 6, batch: int = 256) -> dict:
    """``configs/movielens_two_tower.yaml`` shortened (``steps`` steps of ``batch`` samples)."""
    raw = yaml.safe_load((ROOT / "configs/movielens_two_tower.yaml").read_text())
    raw["data"].update(path=str(MOVIELENS), batch_size=batch, workers=0)
    raw["train"].update(steps=steps, epochs=None, log_every=steps, threads=1)
    raw["supply"] = {"lookahead": 1}
    return raw


pytestmark = pytest.mark.skipif(not MOVIELENS.exists(), reason=f"{MOVIELENS} is absent")


def test_two_tower_trains_bit_identically_on_every_placement():
    result = cosparse.check(None, mapping(), steps=6, log=lambda m: None)
    assert result.ok, result.table()


def test_the_factory_in_python_trains_the_numbers_of_the_kind_and_both_rank_the_corpus():
    trainer = make_trainer(config_from_mapping(mapping()), log=lambda m: None)
    try:
        final = trainer.run()
        by_kind = list(trainer.losses)
    finally:
        trainer.close()
    raw = mapping()
    del raw["model"]["kind"], raw["model"]["two_tower"]
    tables = [{**raw.pop("tables")[0], "features": ["user", "item", "hist_item"]}]
    torch.manual_seed(0)  # (train.seed, which model.kind builds under)
    model = two_tower.build(tables, 0, tower=[128, 64])
    with cosparse.Trainer(model, raw, log=lambda m: None) as py:
        result = py.fit()
    assert len(by_kind) == 6 and result.losses == by_kind
    for key in ("recall@10", "ndcg@10", "mrr", "recall@10.popularity"):
        assert result.metrics[key] == final[key], key
    assert final["eval_samples"] == 943 and final["corpus_items"] == 1682


def test_config_alone_learns_to_rank_above_popularity():
    """Two epochs of the whole log: recall@10 over the corpus above popularity's."""
    raw = mapping(batch=512)
    raw["train"].update(steps=None, epochs=2, threads=2)
    trainer = make_trainer(config_from_mapping(raw), log=lambda m: None)
    try:
        final = trainer.run()
    finally:
        trainer.close()
    assert final["recall@10"] > 1.3 * final["recall@10.popularity"], final


def test_the_config_rules_name_the_key():
    def refused(change, pattern: str) -> None:
        raw = mapping()
        change(raw)
        with pytest.raises(ConfigError, match=pattern):
            config_from_mapping(copy.deepcopy(raw))

    refused(lambda r: r["data"].update(negatives={"per_positive": 1}),
            r"data\.negatives: two-tower retrieval takes the batch's other items")
    refused(lambda r: r["objective"]["tasks"].update(x={"kind": "binary"}),
            r"objective\.tasks\.(label|x)\.kind: a retrieval task is its objective's only task")
    refused(lambda r: r["objective"]["tasks"]["label"].update(kind="binary"),
            r"objective\.tasks: model\.kind 'two_tower' trains one task of kind retrieval")
    refused(lambda r: r["objective"]["tasks"]["label"].update(temperature=0),
            r"objective\.tasks\.label\.temperature")
    no_objective = mapping()
    del no_objective["objective"]
    cfg = config_from_mapping(no_objective)
    assert cfg.objective is not None and cfg.objective.tasks["label"].kind == "retrieval"


def test_two_ranks_train_it_as_one_process_does_within_tolerance(tmp_path):
    """The in-batch softmax on 2 ranks: each rank's users against the global batch's items (an
    all-gather with gradient), the loss summed over the global batch; losses, ranking metrics
    and dense weights match one process within float tolerance (sums in another order); the
    frequency counters are equal. With mixed negatives: each rank's drawn items gathered too.
    (SGD for the dense layers: Adam turns the float noise of a weight whose gradient is near
    zero into steps of +-lr, so its weights diverge by design.)"""
    raw = mapping()
    raw["data"]["events"]["uniform_negatives"] = 1
    raw["model"]["dense_optimizer"] = {"kind": "sgd", "lr": 0.05}
    out = tmp_path / "rank0.pt"
    run_ranks(ROOT / "tests/two_tower_ranks.py", [json.dumps(raw), str(out)], 180)
    got = torch.load(out)
    trainer = make_trainer(config_from_mapping(raw), log=lambda m: None)
    try:
        final = trainer.run()
        losses, dense = list(trainer.losses), trainer.model.state_dict()
    finally:
        trainer.close()
    assert got["metrics"]["world_size"] == 2
    np.testing.assert_allclose(got["losses"], losses, rtol=1e-5)
    for key in ("recall@10", "ndcg@10", "mrr", "recall@10.popularity"):
        assert got["metrics"][key] == pytest.approx(final[key], abs=2e-3), key
    for k, v in dense.items():
        if v.dtype.is_floating_point:
            torch.testing.assert_close(got["dense"][k], v, rtol=1e-5, atol=1e-6)
        else:  # (the frequency estimate's counters: integer counts of the global stream)
            assert torch.equal(got["dense"][k], v), k


def test_the_export_holds_a_faiss_index_whose_flat_top_k_is_the_exact_top_k(tmp_path):
    """``cosparse export`` of a two-tower checkpoint writes the corpus's item embeddings and
    FAISS indexes; the predictor's flat top-k for eval users is the exact top-k by inner
    product (wherever the k-th and the next score are apart), and the IVF index finds most of
    it."""
    raw = mapping()
    raw["train"]["checkpoint"] = {"dir": str(tmp_path / "ck"), "every": 6}
    trainer = make_trainer(config_from_mapping(raw), log=lambda m: None)
    try:
        trainer.run(evaluate=False)
        users = next(iter(trainer.eval_reader.tasks()))
        batch = trainer.eval_reader.build(users)
    finally:
        trainer.close()
    assert main(["export", "--checkpoint", str(tmp_path / "ck"), "--out", str(tmp_path / "ex"),
                 "--format", "npy"]) == 0
    manifest = json.loads((tmp_path / "ex" / "manifest.json").read_text())
    entry = manifest["retrieval"]
    assert entry["items"] == 1682 and entry["dim"] == 64 and entry["why"] is None
    served = load(tmp_path / "ex")
    k = 10
    ids, scores = served.top_k(batch, k)
    items = np.load(tmp_path / "ex" / entry["files"]["embeddings"]["path"])
    corpus = np.load(tmp_path / "ex" / entry["files"]["ids"]["path"])
    exact = served.encode_users(batch).astype(np.float64) @ items.T.astype(np.float64)
    order = np.argsort(-exact, axis=1, kind="stable")
    apart = exact[np.arange(len(exact)), order[:, k - 1]] - \
        exact[np.arange(len(exact)), order[:, k]] > 1e-5
    assert apart.mean() > 0.9 and ids.shape == (batch.batch_size, k)
    for row in np.flatnonzero(apart):
        assert set(ids[row]) == set(corpus[order[row, :k]]), row
    np.testing.assert_allclose(scores, np.take_along_axis(exact, order[:, :k], 1), atol=1e-5)
    ivf, _ = served.top_k(batch, k, index="ivf")
    found = np.mean([len(set(a) & set(b)) / k for a, b in zip(ids, ivf, strict=True)])
    assert found > 0.5, found
