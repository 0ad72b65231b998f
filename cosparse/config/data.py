"""The ``data`` section: the reader, its batches and the synthetic generators, and its rules."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from cosparse.config.errors import ConfigError

if TYPE_CHECKING:
    from cosparse.config.root import Config


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


@dataclass
class EventsConfig:
    """Behaviour-sequence samples from an event log (reader ``taobao_events``): one sample per
    target event, with the user's most recent ``max_len`` events strictly before it."""

    max_len: int = 100
    min_history: int = 1
    positive: list[str] = field(default_factory=lambda: ["buy"])  # behaviours labelled 1
    shuffle: bool = True  # train samples in a seeded random order (else by time)
    seed: int = 0
    synthetic: SequenceSyntheticConfig = field(default_factory=SequenceSyntheticConfig)


@dataclass
class DataConfig:
    reader: Literal["synthetic", "criteo_tsv", "parquet", "taobao_events",
                    "synthetic_sequences"] = "synthetic"
    path: str | None = None
    batch_size: int = 4096
    workers: int = 0
    queue_depth: int = 4
    on_bad_record: Literal["fail", "skip"] = "fail"
    eval_fraction: float = 0.2
    # evaluation scores this many samples per forward at least (consecutive eval batches are
    # joined); None: max(batch_size, 1024). Training batches are not affected.
    eval_batch_size: int | None = None
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    events: EventsConfig = field(default_factory=EventsConfig)


_BEHAVIOURS = ("pv", "cart", "fav", "buy")


def validate_data(cfg: Config) -> None:
    """A file reader has a path, bags are not inverted, and the labels are known behaviours."""
    d = cfg.data
    if d.reader not in ("synthetic", "synthetic_sequences") and not d.path:
        raise ConfigError(f"data.path: reader '{d.reader}' needs a path")
    s = d.synthetic
    if s.bag_max < s.bag_min:
        raise ConfigError("data.synthetic.bag_min/bag_max: need 0 <= bag_min <= bag_max")
    ev = d.events
    bad = [b for b in ev.positive if b not in _BEHAVIOURS]
    if not ev.positive or bad:
        raise ConfigError(f"data.events.positive: need behaviours among {', '.join(_BEHAVIOURS)}"
                          f" (got {ev.positive})")
