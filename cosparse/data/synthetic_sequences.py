"""Synthetic long behaviour sequences (the Taobao sample tops out at 539 events per user).

Batch ``i`` of a split is a pure function of (seed, split, i), like the synthetic click reader.
Every sample has a history of exactly ``seq_len`` events with the keys of the event reader
(``user``, ``target_item``, ``target_cate``, ``hist_item``, ``hist_cate``, ``hist_btag``):

- history items are Zipf(alpha) ranks over ``vocab_size`` (ID = rank + 1), categories are
  ``item % num_cates + 1``, behaviours pv/cart/fav/buy with probabilities .85/.08/.05/.02;
- the target is, with probability 1/2, a copy of one of the 50 most recent history items (a
  returning interest), else a fresh Zipf draw;
- ``label ~ Bernoulli(sigmoid(-1 + 2.5 * [target in history] + w(target)))`` with ``w`` a fixed
  hash of the item in [-1, 1]: learnable only by relating the target to the history.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from cosparse.batch import SparseBatch
from cosparse.config import SequenceSyntheticConfig
from cosparse.data.events import sequence_batch
from cosparse.data.split import Split
from cosparse.data.synthetic import SPLIT_IDS, zipf_tables

_BTAG_P = np.array([0.85, 0.08, 0.05, 0.02])
_RECENT = 50


def item_weight(item: np.ndarray) -> np.ndarray:
    """The hidden per-item logit term in [-1, 1] (a fixed multiplicative hash)."""
    h = (item.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)
    return h.astype(np.float64) / float(1 << 24) * 2.0 - 1.0


class SyntheticSequenceReader:
    """Batches of ``batch_size`` samples with histories of ``cfg.seq_len`` events."""

    def __init__(self, cfg: SequenceSyntheticConfig, batch_size: int, split: Split = "train"):
        if batch_size <= 0:
            raise ValueError("batch_size must be positive")
        if split not in SPLIT_IDS:
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        if cfg.seq_len <= 0:
            raise ValueError("synthetic sequences: seq_len must be positive")
        self.cfg = cfg
        self.batch_size = batch_size
        self.split: Split = split
        self.keys: list[str] = ["user", "target_item", "target_cate", "hist_item", "hist_cate",
                                "hist_btag"]
        self.num_dense: int = 0
        self.bad_records = 0

    @property
    def num_batches(self) -> int:
        return self.cfg.num_batches if self.split == "train" else self.cfg.eval_batches

    def tasks(self, start_batch: int = 0) -> Iterator[int]:
        if start_batch < 0:
            raise ValueError("start_batch must be >= 0")
        return iter(range(start_batch, self.num_batches))

    def build(self, task: int) -> SparseBatch:
        c, b, seq = self.cfg, self.batch_size, self.cfg.seq_len
        rng = np.random.default_rng(np.random.SeedSequence([c.seed, SPLIT_IDS[self.split], task]))
        cdf, _ = zipf_tables(c.vocab_size, c.alpha)
        hist = np.searchsorted(cdf, rng.random(b * seq), side="right").astype(np.int64) + 1
        np.minimum(hist, c.vocab_size, out=hist)
        fresh = np.searchsorted(cdf, rng.random(b), side="right").astype(np.int64) + 1
        pick = rng.integers(0, min(seq, _RECENT), b) + np.arange(b) * seq
        target = np.where(rng.random(b) < 0.5, hist[pick], np.minimum(fresh, c.vocab_size))
        in_hist = (hist.reshape(b, seq) == target[:, None]).any(axis=1)
        logit = -1.0 + 2.5 * in_hist + item_weight(target)
        labels = (rng.random(b) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        btag = rng.choice(4, size=b * seq, p=_BTAG_P).astype(np.int64)
        user = rng.integers(1, c.num_users + 1, b).astype(np.int64)
        lengths = np.full(b, seq, dtype=np.int64)
        return sequence_batch(user, target, target % c.num_cates + 1, lengths, hist,
                              hist % c.num_cates + 1, btag, labels, task)
