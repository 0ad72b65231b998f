"""The root ``Config``: one field per section, and the sections whose only rules are their
ranges (``network``, ``features``; ``bounds.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from cosparse.config.data import DataConfig
from cosparse.config.model import ModelConfig
from cosparse.config.models import ModelEntry
from cosparse.config.objective import ObjectiveConfig
from cosparse.config.parallel import ParallelConfig
from cosparse.config.store import StoreConfig
from cosparse.config.supply import SupplyConfig
from cosparse.config.tables import TableConfig
from cosparse.config.train import TrainConfig


@dataclass
class NetworkConfig:
    """Simulated links (one token bucket per link, shared by its sockets); None: unshaped."""

    link_mbps: float | None = None
    link_latency_ms: float = 0.0


@dataclass
class FeaturesConfig:
    """The unified feature platform: features come from a spec (the registry), computed from the
    raw columns of ``data`` (or read from a materialization), instead of the reader's own keys."""

    spec: str | None = None  # feature spec YAML: features, transforms, versions, consumers
    consumer: str | None = None  # a single-model run: the registry consumer this model is
    materialized: str | None = None  # read the features of this materialization (no recompute)


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    tables: list[TableConfig] = field(default_factory=list)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    models: list[ModelEntry] = field(default_factory=list)  # several models from one extraction
    preset: Literal["resident", "arch-a", "arch-b"] | None = None
    store: StoreConfig = field(default_factory=StoreConfig)
    supply: SupplyConfig = field(default_factory=SupplyConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    objective: ObjectiveConfig | None = None  # None: one binary task, label
