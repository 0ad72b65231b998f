"""Multi-model runs (``models``): several registry consumers trained from one feature extraction,
each with its own model and tables; their rules, and the single-model config of each."""

from __future__ import annotations

import copy
import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cosparse.config.errors import ConfigError
from cosparse.config.model import ModelConfig
from cosparse.config.store import PS_NAME_PATTERN
from cosparse.config.tables import TableConfig

if TYPE_CHECKING:
    from cosparse.config.root import Config


@dataclass
class ModelEntry:
    """One model of a multi-model run: a registry consumer with its own model and tables."""

    name: str = ""
    model: ModelConfig = field(default_factory=ModelConfig)
    tables: list[TableConfig] = field(default_factory=list)


def validate_models(cfg: Config) -> None:
    """A multi-model run: tables per model, a feature registry, one named consumer per model.
    (Each model's own config is then validated like a single-model run's.)"""
    if cfg.tables:
        raise ConfigError("tables: a multi-model run declares its tables per model "
                          "(models[i].tables)")
    if not cfg.features.spec:
        raise ConfigError("features.spec: a multi-model run needs the feature registry its "
                          "models consume from")
    if cfg.features.consumer is not None:
        raise ConfigError("features.consumer: a multi-model run names each consumer in "
                          "models[i].name")
    if cfg.train.early_stop is not None:
        raise ConfigError("train.early_stop: the models of a multi-model run train on one "
                          "stream to the same step; early stopping is for single-model runs")
    if cfg.store.remote.namespace is not None:
        raise ConfigError("store.remote.namespace: in a multi-model run each model's tables live "
                          "in a PS namespace named after it (models[i].name); leave it out, and "
                          "share a table on purpose with models[i].tables[j].shared_as")
    seen: set[str] = set()
    for i, e in enumerate(cfg.models):
        if not e.name:
            raise ConfigError(f"models[{i}].name: every model needs the name of its registry "
                              "consumer")
        if cfg.supply.path != "resident" and not re.match(PS_NAME_PATTERN, e.name):
            raise ConfigError(f"models[{i}].name: {e.name!r} names the model's PS namespace: 1 "
                              "to 128 letters, digits, '_', '.', '-'")
        if e.name in seen:
            raise ConfigError(f"models[{i}].name: model '{e.name}' is declared twice")
        seen.add(e.name)


def model_config(cfg: Config, i: int) -> Config:
    """The single-model config of ``cfg.models[i]``: its model, tables and registry consumer,
    the shared data, store, supply and train settings, its own output paths and its own PS
    namespace (the model's name)."""
    e = cfg.models[i]
    tr = cfg.train

    def own(path: str | None) -> str | None:
        if path is None:
            return None
        p = Path(path)
        return str(p.with_name(f"{p.stem}.{e.name}{p.suffix}") if p.suffix else p / e.name)

    train = dataclasses.replace(
        tr, metrics_json=own(tr.metrics_json), tensorboard_dir=own(tr.tensorboard_dir),
        checkpoint=dataclasses.replace(tr.checkpoint, dir=own(tr.checkpoint.dir)))
    # its own PS namespace: same-named tables of two models never share rows by accident
    remote = dataclasses.replace(cfg.store.remote, namespace=cfg.store.remote.namespace or e.name)
    return dataclasses.replace(
        cfg, model=copy.deepcopy(e.model), tables=copy.deepcopy(e.tables), models=[],
        features=dataclasses.replace(cfg.features, consumer=e.name), train=train,
        store=dataclasses.replace(cfg.store, remote=remote))
