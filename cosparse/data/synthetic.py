"""Synthetic Zipf(alpha) click data with learnable labels; any batch is built independently.

Batch ``i`` of a split is a pure function of (seed, split, i): its numpy Generator is seeded from
``SeedSequence([seed, split_id, i])``, so ``tasks(start_batch=k)`` costs nothing to seek.

IDs: a Zipf rank over [0, vocab_size) drawn by inverse CDF (a cached cumulative table plus a guide
table), scrambled by a bijective 63-bit hash mixed with the feature index, so every feature has its
own hot IDs and IDs look like hashed 64-bit IDs (non-negative int64).

Labels: ``logit = bias + scale * sum_f w(first ID of feature f) + dense term`` with ``w`` a fixed
N(0, 1)-like hash of the ID; ``label ~ Bernoulli(sigmoid(logit))`` from the batch's Generator.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import numpy as np
import torch

from cosparse.batch import SparseBatch
from cosparse.config import SyntheticConfig
from cosparse.data import kernels as K
from cosparse.data.split import Split

SPLIT_IDS: dict[str, int] = {"train": 0, "eval": 1}
LABEL_BIAS = -1.0
SPARSE_SCALE = 2.0  # the sparse logit term has about this standard deviation
DENSE_CENTER = 0.8  # about the mean of log1p(lognormal(0, 1))


@functools.lru_cache(maxsize=8)
def zipf_tables(vocab_size: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """(cdf float64 [vocab], guide int64 [G]) for Zipf(alpha) over ranks 0..vocab-1.

    ``guide[g]`` is the first rank whose cdf exceeds g / G, so a draw walks only a few entries.
    """
    if vocab_size <= 0:
        raise ValueError("vocab_size must be positive")
    p = np.arange(1, vocab_size + 1, dtype=np.float64) ** -float(alpha)
    cdf = np.cumsum(p)
    cdf /= cdf[-1]
    cdf[-1] = 1.0
    g = max(1024, min(4 * vocab_size, 1 << 21))
    guide = np.searchsorted(cdf, np.arange(g, dtype=np.float64) / g, side="right").astype(np.int64)
    cdf.setflags(write=False)
    guide.setflags(write=False)
    return cdf, guide


def dense_weights(num_dense: int) -> np.ndarray:
    """Fixed weights of the dense features in the hidden logit."""
    return (0.5 * np.sin(np.arange(1, num_dense + 1, dtype=np.float64) * 1.7)).astype(np.float64)


class SyntheticReader:
    """Zipf synthetic batches of ``batch_size`` samples; ``split`` picks an independent stream."""

    def __init__(self, cfg: SyntheticConfig, batch_size: int, split: Split = "train") -> None:
        if batch_size <= 0:
            raise ValueError("batch_size must be positive")
        if split not in SPLIT_IDS:
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        if cfg.bag_min < 0 or cfg.bag_max < cfg.bag_min:
            raise ValueError("synthetic: need 0 <= bag_min <= bag_max")
        if cfg.seed < 0:
            raise ValueError("synthetic: seed must be >= 0")
        self.cfg = cfg
        self.batch_size = batch_size
        self.split: Split = split
        self.keys: list[str] = [f"{cfg.feature_prefix}{i + 1}" for i in range(cfg.num_features)]
        self.num_dense: int = cfg.num_dense

    @property
    def num_batches(self) -> int:
        return self.cfg.num_batches if self.split == "train" else self.cfg.eval_batches

    def tasks(self, start_batch: int = 0) -> Iterator[int]:
        """Batch indices ``start_batch .. num_batches - 1``."""
        if start_batch < 0:
            raise ValueError("start_batch must be >= 0")
        return iter(range(start_batch, self.num_batches))

    def rng(self, index: int) -> np.random.Generator:
        ss = np.random.SeedSequence([self.cfg.seed, SPLIT_IDS[self.split], int(index)])
        return np.random.Generator(np.random.PCG64(ss))

    def build(self, task: int) -> SparseBatch:
        """Batch ``task`` of this split (pure function of seed, split and index)."""
        c = self.cfg
        b, f = self.batch_size, c.num_features
        rng = self.rng(task)
        cdf, guide = zipf_tables(c.vocab_size, c.alpha)
        if c.bag_min == c.bag_max:
            lengths = np.full(f * b, c.bag_min, np.int64)
        else:
            lengths = rng.integers(c.bag_min, c.bag_max + 1, size=f * b, dtype=np.int64)
        u = rng.random(int(lengths.sum()))
        values, wsum = K.zipf_ids(u, lengths, f, b, cdf, guide)
        dense = np.log1p(rng.lognormal(0.0, 1.0, size=(b, c.num_dense)))
        logit = LABEL_BIAS + (SPARSE_SCALE / np.sqrt(max(f, 1))) * wsum
        if c.num_dense:
            logit += (dense - DENSE_CENTER) @ dense_weights(c.num_dense)
        labels = (rng.random(b) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        return SparseBatch(
            list(self.keys),
            torch.from_numpy(values),
            torch.from_numpy(lengths),
            torch.from_numpy(dense.astype(np.float32)),
            torch.from_numpy(labels),
            bad_records=0,
            index=int(task),
        )
