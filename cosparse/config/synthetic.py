"""The synthetic generators' sections of ``data``: ``data.synthetic`` (click data) and
``data.events.synthetic`` (long behaviour sequences)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SyntheticConfig:
    """Zipf(alpha) synthetic click data; the defaults are Criteo-like (13 dense, 26 categorical)."""

    num_features: int = 26
    feature_prefix: str = "C"
    num_dense: int = 13
    vocab_size: int = 1_000_000
    alpha: float = 1.05
    bag_min: int = 1
    bag_max: int = 1
    seed: int = 0
    num_batches: int = 1_000_000
    eval_batches: int = 4


@dataclass
class SequenceSyntheticConfig:
    """Synthetic long behaviour sequences (reader ``synthetic_sequences``): Zipf items, every
    history exactly ``seq_len`` long, labels learnable from the target and the history."""

    seq_len: int = 1000
    vocab_size: int = 100_000
    num_cates: int = 1000
    num_users: int = 10_000
    alpha: float = 1.05
    seed: int = 0
    num_batches: int = 1_000_000
    eval_batches: int = 4
