"""Trainer: bit-exact resume from a checkpoint, metrics output, and learning on real Criteo rows."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cosparse.config import (
    CheckpointConfig,
    Config,
    DataConfig,
    DenseOptimizerConfig,
    ModelConfig,
    OptimizerConfig,
    SupplyConfig,
    SyntheticConfig,
    TableConfig,
    TrainConfig,
    validate,
)
from cosparse.train.trainer import Trainer

CRITEO = Path(__file__).resolve().parents[2] / "shared/data/criteo/train_head10k.txt"
CATS = [f"C{i}" for i in range(1, 27)]


def _synthetic_cfg(tmp_path, steps, every=0, workers=0) -> Config:
    return validate(Config(
        data=DataConfig(reader="synthetic", batch_size=128, workers=workers,
                        synthetic=SyntheticConfig(num_features=6, vocab_size=5000, bag_min=1,
                                                  bag_max=3, seed=5, eval_batches=2)),
        model=ModelConfig(kind="dlrm", bottom=[16, 8], top=[16, 1]),
        tables=[TableConfig(name="a", dim=8, features=["C1", "C2", "C3"]),
                TableConfig(name="b", dim=8, features=["C4", "C5", "C6"], pooling="mean",
                            optimizer=OptimizerConfig(kind="adam", lr=0.01))],
        supply=SupplyConfig(lookahead=2),
        train=TrainConfig(steps=steps, progress=False, log_every=5,
                          checkpoint=CheckpointConfig(dir=str(tmp_path / "ck"), every=every),
                          metrics_json=str(tmp_path / "m.jsonl")),
    ))


def _criteo_cfg(tmp_path, steps, every=0, epochs=1, batch=512) -> Config:
    return validate(Config(
        data=DataConfig(reader="criteo_tsv", path=str(CRITEO), batch_size=batch,
                        eval_fraction=0.2),
        model=ModelConfig(kind="dlrm", bottom=[32, 8], top=[32, 1],
                          dense_optimizer=DenseOptimizerConfig(kind="adagrad", lr=0.02)),
        tables=[TableConfig(name="cat", dim=8, features=CATS,
                            optimizer=OptimizerConfig(kind="rowwise_adagrad", lr=0.05))],
        train=TrainConfig(steps=steps, epochs=epochs, progress=False, log_every=10,
                          checkpoint=CheckpointConfig(dir=str(tmp_path / "ck"), every=every)),
    ))


def _assert_same_rows(ta, tb):
    """The two trainers hold the same rows and optimizer state. A row only one of them holds was
    created by prefetching beyond the last step (how far depends on timing) and never trained:
    it must hold exactly its initial value, which is what the other reads for it."""
    a, b = ta.ec.export_rows(), tb.ec.export_rows()
    assert a.keys() == b.keys()
    for name in a:
        ids_a, ids_b = a[name]["ids"], b[name]["ids"]
        common = np.intersect1d(ids_a, ids_b)
        rows_a = a[name]["rows"][np.argsort(ids_a)][np.searchsorted(np.sort(ids_a), common)]
        rows_b = b[name]["rows"][np.argsort(ids_b)][np.searchsorted(np.sort(ids_b), common)]
        assert np.array_equal(rows_a, rows_b)
        for t, ids, rows in ((ta, ids_a, a[name]["rows"]), (tb, ids_b, b[name]["rows"])):
            extra = ~np.isin(ids, common)
            assert np.array_equal(rows[extra], t.ec.tables[name].initial_rows(ids[extra])), name
        assert common.shape[0] > 0


@pytest.mark.parametrize("kind", ["synthetic", "criteo"])
def test_resume_is_bit_exact(tmp_path, kind):
    if kind == "criteo" and not CRITEO.exists():
        pytest.skip("../shared/data/criteo is not present")
    make = _synthetic_cfg if kind == "synthetic" else _criteo_cfg
    kw = {} if kind == "synthetic" else {"epochs": 2}  # criteo: 16 batches/epoch, crosses epoch
    total, cut = (12, 6) if kind == "synthetic" else (24, 20)

    full = Trainer(make(tmp_path / "full", total, **kw))
    full.run()
    full.close()

    first = Trainer(make(tmp_path / "part", cut, every=cut, **kw))
    first.run()
    first.close()
    resumed = Trainer(make(tmp_path / "part", total, **kw))
    resumed.resume(str(tmp_path / "part" / "ck"))
    resumed.run()
    resumed.close()

    assert first.losses + resumed.losses == full.losses  # bit-identical floats
    _assert_same_rows(resumed, full)
    dense_full, dense_resumed = full.model.state_dict(), resumed.model.state_dict()
    for k, p in dense_full.items():
        assert torch.equal(p, dense_resumed[k]), k


def test_metrics_json_lines_and_stage_times(tmp_path):
    t = Trainer(_synthetic_cfg(tmp_path, 10, workers=1))
    final = t.run()
    t.close()
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    kinds = {r["kind"] for r in records}
    assert {"train", "eval", "final"} <= kinds
    train = [r for r in records if r["kind"] == "train"]
    for stage in ("read", "featurize", "prep", "plan", "fill", "gather", "forward", "backward",
                  "optim", "writeback"):
        assert train[-1][f"stage_ms.{stage}"] >= 0
    assert train[-1]["samples_per_s"] > 0
    assert 0.0 < final["auc"] < 1.0


def _hashed_logistic_regression_auc(train_batches, eval_batches, buckets=2**18, epochs=3) -> float:
    """Logistic regression on the same features: hashed categorical one-hots + log1p dense."""
    from cosparse.train.evaluate import roc_auc

    torch.manual_seed(0)
    emb = torch.nn.EmbeddingBag(buckets, 1, mode="sum")
    torch.nn.init.zeros_(emb.weight)
    lin = torch.nn.Linear(13, 1)
    opt = torch.optim.Adagrad([*emb.parameters(), *lin.parameters()], lr=0.05)

    def logits(b):
        # one bag per sample holding every feature's hashed ID (a feature-aware hash)
        n = len(b.keys)
        feature = torch.repeat_interleave(torch.arange(n), b.lengths.view(n, -1).sum(1))
        hashed = torch.remainder(b.values * 1_000_003 + feature * 7919, buckets)
        sample = torch.repeat_interleave(torch.arange(b.lengths.numel()) % b.batch_size, b.lengths)
        order = torch.argsort(sample, stable=True)
        counts = torch.bincount(sample, minlength=b.batch_size)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(counts, 0)[:-1]])
        return (emb(hashed[order], offsets) + lin(b.dense)).squeeze(1)

    for _ in range(epochs):
        for b in train_batches:
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits(b), b.labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        scores = torch.cat([torch.sigmoid(logits(b)) for b in eval_batches]).numpy()
    labels = torch.cat([b.labels for b in eval_batches]).numpy()
    return roc_auc(labels, scores)


@pytest.mark.skipif(not CRITEO.exists(), reason="../shared/data/criteo is not present")
def test_dlrm_beats_logistic_regression_on_criteo(tmp_path):
    """First 8k rows train, last 2k evaluate; the baseline is the best of 1..3 LR epochs."""
    cfg = _criteo_cfg(tmp_path, steps=10_000, epochs=1, batch=128)
    trainer = Trainer(cfg)
    final = trainer.run()
    trainer.close()
    train = [trainer.train_reader.build(t) for t in trainer.train_reader.tasks()]
    evals = [trainer.eval_reader.build(t) for t in trainer.eval_reader.tasks()]
    assert sum(b.batch_size for b in train) == 8000
    lr_auc = max(_hashed_logistic_regression_auc(train, evals, epochs=e) for e in (1, 2, 3))
    print(f"DLRM auc {final['auc']:.4f} vs logistic regression auc {lr_auc:.4f}")
    assert final["eval_samples"] == 2000
    assert final["auc"] > lr_auc


def test_interrupted_checkpoint_write_leaves_the_previous_one(tmp_path, monkeypatch):
    import cosparse.train.checkpoint as ckpt

    t = Trainer(_synthetic_cfg(tmp_path, 4, every=2))
    t.run()
    root = tmp_path / "ck"
    assert (root / "LATEST").read_text() == "step_00000004"

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.np, "savez", crash)
    t.state.step = 6
    from cosparse.train.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match="step 6 .* failed: disk full; nothing of it was "
                                              "committed"):
        t.save()
    t.close()
    assert (root / "LATEST").read_text() == "step_00000004"
    assert not (root / "step_00000006").exists()
    assert not list(root.glob(".tmp-*"))
    state, _, tables, _ = ckpt.load_checkpoint(root)
    assert state.step == 4 and set(tables) == {"a", "b"}


def test_tier_metrics_per_table_and_overall(tmp_path):
    from cosparse.config import StoreConfig, TierConfig

    cfg = _synthetic_cfg(tmp_path, 10)
    cfg.store = StoreConfig(device=TierConfig(rows=1500))
    t = Trainer(cfg)
    t.run()
    t.close()
    train = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    last = [r for r in train if r["kind"] == "train"][-1]
    for name in ("a", "b"):
        assert 0.0 <= last[f"hit_rate.device.{name}"] <= 1.0
        assert last[f"bytes.device_host.{name}"] >= 0
        assert last[f"evictions.device.{name}"] >= 0
    assert last["evictions.device"] == last["evictions.device.a"] + last["evictions.device.b"]
    assert last["evictions.device"] > 0 and last["bytes.device_host"] > 0
    assert 0.0 < last["hbm_share"] <= 1.0
    assert "lookahead_shrinks" in last
