"""Evaluation is batched: consecutive eval batches are joined (one dedup, one row read and one
forward for each group), for every placement (issue 11, defect 12)."""

from __future__ import annotations

import numpy as np
import torch

from cosparse.batch import SparseBatch, concat_batches
from cosparse.config import config_from_mapping
from cosparse.train.trainer import Trainer


def _random_batch(rng: np.random.Generator, keys: list[str], b: int, index: int) -> SparseBatch:
    lengths = rng.integers(0, 4, size=len(keys) * b)
    values = rng.integers(0, 1 << 40, size=int(lengths.sum()))
    return SparseBatch(keys, torch.from_numpy(values), torch.from_numpy(lengths),
                       torch.from_numpy(rng.random((b, 3), dtype=np.float32)),
                       torch.from_numpy((rng.random(b) < 0.5).astype(np.float32)), index=index)


def test_concat_batches_keeps_every_sample_and_bag():
    rng = np.random.default_rng(3)
    keys = ["a", "b", "c"]
    parts = [_random_batch(rng, keys, b, i) for i, b in enumerate((5, 1, 7))]
    joined = concat_batches(parts)
    assert joined.batch_size == 13 and joined.index == 0
    assert torch.equal(joined.dense, torch.cat([p.dense for p in parts]))
    assert torch.equal(joined.labels, torch.cat([p.labels for p in parts]))
    for k in keys:
        ids, lens = joined.feature(k)
        assert torch.equal(ids, torch.cat([p.feature(k)[0] for p in parts]))
        assert torch.equal(lens, torch.cat([p.feature(k)[1] for p in parts]))


def _cfg(tmp_path, eval_batch_size: int | None) -> dict:
    return {
        "data": {"reader": "synthetic", "batch_size": 32, "workers": 0,
                 "eval_batch_size": eval_batch_size,
                 "synthetic": {"num_features": 4, "num_dense": 3, "vocab_size": 5000,
                               "num_batches": 4, "eval_batches": 40, "seed": 1}},
        "model": {"kind": "dlrm", "bottom": [8, 4], "top": [8, 1]},
        "tables": [{"name": "t", "dim": 4, "features": ["C1", "C2", "C3", "C4"]}],
        "store": {"device": {"rows": 400}, "host": {}},
        "supply": {"lookahead": 2},
        "train": {"steps": 4, "progress": False, "threads": 1},
    }


def test_tiered_evaluation_joins_small_batches(tmp_path):
    """40 eval batches of 32 samples: two forwards of at least 1024 samples, not forty, and
    the same scores as one forward per batch."""
    scores = {}
    forwards = {}
    for ebs in (None, 32):
        t = Trainer(config_from_mapping(_cfg(tmp_path, ebs)), log=lambda m: None)
        try:
            calls = []
            model_forward = t.model.forward
            t.model.forward = lambda x, _f=model_forward, _c=calls: (_c.append(1), _f(x))[1]
            t.run()
            scores[ebs] = t.evaluate()
            forwards[ebs] = len(calls)
        finally:
            t.close()
    assert forwards[None] == 2 * 2 + 4 and forwards[32] == 2 * 40 + 4  # two evals + 4 steps
    assert scores[None]["eval_samples"] == scores[32]["eval_samples"] == 40 * 32
    assert abs(scores[None]["auc"] - scores[32]["auc"]) < 1e-6
    assert abs(scores[None]["logloss"] - scores[32]["logloss"]) < 1e-6
