"""Typed configuration (data, model, tables, store, supply, train) loaded from YAML, with validation.

Every section is a dataclass in its own module, with its validator next to it (``data.py``:
``DataConfig`` and ``validate_data``); ``validate.py`` runs them in order after the numeric
ranges of ``bounds.py``. Unknown keys, wrong types, inconsistent settings and settings that the
chosen placement would ignore raise ``ConfigError`` naming the dotted key
(``tables[0].optimizer.kind``) at start-up. ``presets.py`` holds the presets, ``load.py`` reads
files.
"""

from cosparse.config.convert import from_dict
from cosparse.config.data import (
    ColumnsConfig,
    CsvConfig,
    DataConfig,
    NegativesConfig,
    ShuffleConfig,
    SplitConfig,
    StreamConfig,
    SyntheticConfig,
)
from cosparse.config.errors import ConfigError
from cosparse.config.events import EventsConfig
from cosparse.config.labels import LabelConfig
from cosparse.config.libsvm import LibsvmConfig
from cosparse.config.load import config_from_mapping, load_config, read_config_mapping
from cosparse.config.mapping import set_dotted
from cosparse.config.model import DenseOptimizerConfig, DINConfig, ModelConfig
from cosparse.config.models import ModelEntry, model_config
from cosparse.config.multitask import MultiTaskConfig
from cosparse.config.parallel import ParallelConfig, ShardingKind
from cosparse.config.presets import PRESETS, apply_preset, switch_preset
from cosparse.config.retrieval import TwoTowerConfig
from cosparse.config.root import Config, FeaturesConfig, NetworkConfig
from cosparse.config.sequence import SASRecConfig
from cosparse.config.sizes import parse_bytes
from cosparse.config.store import (
    HostTierConfig,
    QuotaConfig,
    RemoteConfig,
    StoreConfig,
    TierConfig,
)
from cosparse.config.supply import SupplyConfig
from cosparse.config.synthetic import SequenceSyntheticConfig
from cosparse.config.tables import InitConfig, OptimizerConfig, TableConfig
from cosparse.config.train import (
    CheckpointConfig,
    EarlyStopConfig,
    HealthConfig,
    TraceConfig,
    TrainConfig,
)
from cosparse.config.validate import validate

__all__ = [
    "PRESETS",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "DINConfig",
    "MultiTaskConfig",
    "ColumnsConfig",
    "CsvConfig",
    "DataConfig",
    "DenseOptimizerConfig",
    "EarlyStopConfig",
    "EventsConfig",
    "HealthConfig",
    "FeaturesConfig",
    "HostTierConfig",
    "InitConfig",
    "LabelConfig",
    "LibsvmConfig",
    "ModelConfig",
    "NegativesConfig",
    "ModelEntry",
    "NetworkConfig",
    "OptimizerConfig",
    "ParallelConfig",
    "QuotaConfig",
    "RemoteConfig",
    "SequenceSyntheticConfig",
    "ShuffleConfig",
    "StreamConfig",
    "SplitConfig",
    "ShardingKind",
    "StoreConfig",
    "TraceConfig",
    "SupplyConfig",
    "SyntheticConfig",
    "TableConfig",
    "TierConfig",
    "TrainConfig",
    "TwoTowerConfig",
    "SASRecConfig",
    "apply_preset",
    "config_from_mapping",
    "from_dict",
    "load_config",
    "model_config",
    "parse_bytes",
    "read_config_mapping",
    "set_dotted",
    "switch_preset",
    "validate",
]
