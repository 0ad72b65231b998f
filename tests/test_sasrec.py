"""Sequence transformers (issue 36, item 3): SASRec's jagged causal encoder against a padded
reference, BST's target attention blind to padding, ``model.kind: sasrec`` from config alone on
Amazon Beauty (leave-one-out, the whole corpus ranked), bit-identical on every placement, the
same numbers from Python, on 2 ranks within tolerance, its export's top-k, and BST trained as a
ranking model on the Taobao log on every placement."""

from __future__ import annotations

import copy
import json
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
from cosparse.models import bst, sasrec
from cosparse.nn.sequence import CausalEncoder, TargetTransformer
from cosparse.nn.types import Jagged
from cosparse.serving import load
from tests.torchrun import run_ranks

ROOT = Path(__file__).resolve().parents[1]
BEAUTY = ROOT.parent / "shared/data/seqrec-s3rec/Beauty.txt"
TAOBAO = ROOT.parent / "shared/data/taobao-userbehavior/UserBehavior_head84k.csv"


def jagged(lengths: list[int], dim: int, seed: int = 0) -> Jagged:
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor(lengths, dtype=torch.int64)
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    torch.cumsum(lens, 0, out=offsets[1:])
    return Jagged(torch.randn(int(offsets[-1]), dim, generator=g), lens, offsets)


def padded_reference(enc: CausalEncoder, hist: Jagged) -> torch.Tensor:
    """SASRec as written in the paper's form: every history padded to the longest, oldest event
    first, every position through every block (causal), the output at the last event."""
    b, d = hist.batch_size, hist.values.shape[1]
    longest = int(hist.lengths.max())
    x = torch.zeros(b, longest, d)
    for s in range(b):
        rows = hist.values[hist.offsets[s]:hist.offsets[s + 1]]
        x[s, :rows.shape[0]] = rows.flip(0)  # (the lookup gives the most recent event first)
    x = enc.norm(x + enc.positions.weight[:longest][None])

    def attend(h: torch.Tensor) -> torch.Tensor:
        q, k, v = h.permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
    for block in enc.blocks:
        x = block(x, attend)
    return x[torch.arange(b), hist.lengths - 1]


def test_the_jagged_causal_encoder_is_the_padded_one_and_blind_to_its_batch():
    torch.manual_seed(0)
    enc = CausalEncoder(16, 12, 2, 2, 32, None).eval()
    hist = jagged([3, 12, 1, 7], 16)
    with torch.no_grad():
        got = enc(hist)
        torch.testing.assert_close(got, padded_reference(enc, hist), rtol=1e-5, atol=1e-5)
        alone = enc(Jagged(hist.values[:3], hist.lengths[:1], hist.offsets[:2]))
        torch.testing.assert_close(alone[0], got[0], rtol=1e-5, atol=1e-5)
        empty = enc(Jagged(hist.values[:0], torch.zeros(2, dtype=torch.int64),
                           torch.zeros(3, dtype=torch.int64)))
    assert empty.shape == (2, 16) and torch.isfinite(empty).all()
    with pytest.raises(ValueError, match="longer than the 12 positions"):
        enc(jagged([13], 16))


def test_bst_target_attention_sees_the_target_and_its_own_events_only():
    torch.manual_seed(0)
    att = TargetTransformer(8, 10, 1, 2, 16, None).eval()
    hist = jagged([2, 9, 0], 8)
    target = torch.randn(3, 8)
    with torch.no_grad():
        got = att(target, hist)
        alone = att(target[:1], Jagged(hist.values[:2], hist.lengths[:1], hist.offsets[:2]))
        changed = hist.values.clone()
        changed[2:] += 1.0  # (the second sample's events)
        other = att(target, Jagged(changed, hist.lengths, hist.offsets))
    torch.testing.assert_close(alone[0], got[0], rtol=1e-5, atol=1e-5)
    assert torch.equal(other[0], got[0]) and not torch.equal(other[1], got[1])
    assert torch.isfinite(got[2]).all()  # (no history: the target attends to itself)


def mapping(steps: int = 6, batch: int = 256) -> dict:
    """``configs/beauty_sasrec.yaml`` shortened (``steps`` steps of ``batch`` samples)."""
    raw = yaml.safe_load((ROOT / "configs/beauty_sasrec.yaml").read_text())
    raw["data"].update(path=str(BEAUTY), batch_size=batch, workers=0)
    raw["train"].update(steps=steps, epochs=None, log_every=steps, threads=1)
    raw["supply"] = {"lookahead": 1}
    return raw


needs_beauty = pytest.mark.skipif(not BEAUTY.exists(), reason=f"{BEAUTY} is absent")


@needs_beauty
def test_sasrec_trains_bit_identically_on_every_placement():
    """With mixed negatives: one uniformly drawn item per sample, through the tiers."""
    raw = mapping()
    raw["data"]["events"]["uniform_negatives"] = 1
    result = cosparse.check(None, raw, steps=6, log=lambda m: None)
    assert result.ok, result.table()


@needs_beauty
def test_the_factory_in_python_trains_the_numbers_of_the_kind_and_both_rank_the_corpus():
    cfg = config_from_mapping(mapping())
    assert all(t.pooling == "none" for t in cfg.tables)  # (the kind reads the history unpooled)
    trainer = make_trainer(cfg, log=lambda m: None)
    try:
        final = trainer.run()
        by_kind = list(trainer.losses)
    finally:
        trainer.close()
    raw = mapping()
    dropout = raw["model"].pop("dropout")
    del raw["model"]["kind"], raw["model"]["sasrec"]
    table = {**raw.pop("tables")[0], "features": ["user", "item", "hist_item"], "pooling": "none"}
    torch.manual_seed(0)  # (train.seed, which model.kind builds under)
    model = sasrec.build([table], 0, max_len=50, dropout=dropout)
    with cosparse.Trainer(model, raw, log=lambda m: None) as py:
        result = py.fit()
    assert len(by_kind) == 6 and result.losses == by_kind
    for key in ("recall@10", "ndcg@10", "mrr", "recall@10.popularity"):
        assert result.metrics[key] == final[key], key
    assert final["eval_samples"] == 22363 and final["corpus_items"] == 12101


@needs_beauty
def test_the_config_rules_name_the_key():
    def refused(change, pattern: str, error: type[Exception] = ConfigError) -> None:
        raw = mapping()
        change(raw)
        with pytest.raises(error, match=pattern):
            config_from_mapping(copy.deepcopy(raw))

    refused(lambda r: r["data"].update(negatives={"per_positive": 1}),
            r"data\.negatives: (SASRec takes|samples negatives)")
    refused(lambda r: r["objective"]["tasks"]["label"].update(kind="binary"),
            r"objective\.tasks: model\.kind 'sasrec' trains one task of kind retrieval")
    refused(lambda r: r["model"]["sasrec"].update(layers=0), r"model\.sasrec\.layers")
    pooled = {"name": "ids", "dim": 64, "features": ["user", "item", "hist_item"]}
    with pytest.raises(ConfigError, match=r"tables\[0\]\.pooling: SASRec reads the history"):
        sasrec.build([pooled], 0)
    with pytest.raises(ConfigError, match=r"model\.sasrec\.heads: 3 heads do not divide"):
        sasrec.build([{**pooled, "pooling": "none"}], 0, heads=3)


@needs_beauty
def test_two_ranks_train_it_as_one_process_does_within_tolerance(tmp_path):
    """The in-batch softmax over the global batch's items on 2 ranks; losses, ranking metrics
    and dense weights match one process within float tolerance (SGD on the dense layers, no
    dropout: see the two-tower's test)."""
    raw = mapping(steps=4)
    raw["model"].update(dropout=0.0, dense_optimizer={"kind": "sgd", "lr": 0.05})
    out = tmp_path / "rank0.pt"
    run_ranks(ROOT / "tests/two_tower_ranks.py", [json.dumps(raw), str(out)], 240)
    got = torch.load(out)
    trainer = make_trainer(config_from_mapping(raw), log=lambda m: None)
    try:
        final = trainer.run()
        losses, dense = list(trainer.losses), trainer.model.state_dict()
    finally:
        trainer.close()
    assert got["metrics"]["world_size"] == 2
    np.testing.assert_allclose(got["losses"], losses, rtol=1e-5)
    for key in ("recall@10", "ndcg@10", "mrr"):
        assert got["metrics"][key] == pytest.approx(final[key], abs=2e-3), key
    for k, v in dense.items():
        if v.dtype.is_floating_point:
            torch.testing.assert_close(got["dense"][k], v, rtol=1e-4, atol=1e-5)
        else:
            assert torch.equal(got["dense"][k], v), k


@needs_beauty
def test_the_export_serves_each_users_top_k_items(tmp_path):
    raw = mapping()
    raw["train"]["checkpoint"] = {"dir": str(tmp_path / "ck"), "every": 6}
    trainer = make_trainer(config_from_mapping(raw), log=lambda m: None)
    try:
        trainer.run(evaluate=False)
        batch = trainer.eval_reader.build(next(iter(trainer.eval_reader.tasks())))
    finally:
        trainer.close()
    assert main(["export", "--checkpoint", str(tmp_path / "ck"), "--out", str(tmp_path / "ex"),
                 "--format", "npy"]) == 0
    entry = json.loads((tmp_path / "ex" / "manifest.json").read_text())["retrieval"]
    assert entry["items"] == 12101 and entry["why"] is None
    served = load(tmp_path / "ex")
    ids, scores = served.top_k(batch, 10)
    items = np.load(tmp_path / "ex" / entry["files"]["embeddings"]["path"])
    exact = served.encode_users(batch) @ items.T
    np.testing.assert_allclose(scores, -np.sort(-exact, axis=1)[:, :10], rtol=1e-5, atol=1e-5)
    assert ids.shape == (batch.batch_size, 10)
    unseen, unseen_scores = served.top_k(batch, 10, exclude="hist_item")
    corpus = np.load(tmp_path / "ex" / entry["files"]["ids"]["path"])
    seen, lengths = (t.numpy() for t in batch.feature("hist_item"))
    starts = np.cumsum(lengths) - lengths
    for row in range(batch.batch_size):  # (the exact top-10 of the items the user has not seen)
        mine = set(seen[starts[row]:starts[row] + lengths[row]].tolist())
        masked = np.where(np.isin(corpus, list(mine)), -np.inf, exact[row])
        assert not mine & set(unseen[row].tolist())
        np.testing.assert_allclose(unseen_scores[row], -np.sort(-masked)[:10], rtol=1e-5,
                                   atol=1e-5)


@pytest.mark.skipif(not TAOBAO.exists(), reason=f"{TAOBAO} is absent")
def test_bst_ranks_on_the_taobao_log_bit_identically_on_every_placement():
    tables = [{"name": "item", "dim": 16, "pooling": "none",
               "features": ["target_item", "hist_item"]},
              {"name": "cate", "dim": 16, "pooling": "none",
               "features": ["target_cate", "hist_cate"]},
              {"name": "rest", "dim": 8, "features": ["user", "hist_btag"]}]
    raw = {"data": {"reader": "taobao_events", "path": str(TAOBAO), "batch_size": 256,
                    "workers": 0, "events": {"max_len": 30}},
           "train": {"steps": 6, "log_every": 6, "threads": 1}, "supply": {"lookahead": 1}}

    def model() -> bst.BST:
        return bst.build(tables, 0, pairs=[["target_item", "hist_item"],
                                           ["target_cate", "hist_cate"]],
                         max_len=30, mlp=[64, 32], dropout=0.1)

    result = cosparse.check(model, raw, steps=6, log=lambda m: None)
    assert result.ok, result.table()
