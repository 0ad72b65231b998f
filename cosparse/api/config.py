"""The public ``load_config``, and the config a trainer runs a model of the user's own under.

A config for a user's model needs no ``model`` section (its ``kind`` stays unset: no built-in
model's rules apply) and no ``tables`` when the model's ``EmbeddingBagCollection`` holds them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cosparse.config import Config, ConfigError, TableConfig, from_dict, read_config_mapping
from cosparse.config.eval_path import refuse_fraction_beside_eval_path
from cosparse.config.model import factory_exclusive_with_kind
from cosparse.config.presets import apply_preset
from cosparse.config.validate import validate


def load_config(source: str | Path | Mapping[str, Any]) -> Config:
    """A validated ``Config`` from a YAML file or a mapping (its preset applied). Without
    ``model.kind`` the model is the caller's own; without ``tables`` they come from the model's
    ``EmbeddingBagCollection`` when a ``cosparse.Trainer`` takes it."""
    if isinstance(source, Mapping):
        raw = copy.deepcopy(dict(source))
    else:
        raw = read_config_mapping(source)
    factory_exclusive_with_kind(raw)
    model = raw.get("model")
    if model is None or (isinstance(model, dict) and "kind" not in model):
        raw["model"] = {**(model or {}), "kind": None}
    refuse_fraction_beside_eval_path(raw)
    return validate(from_dict(Config, apply_preset(raw)), tables_later=True)


def config_for_model(cfg: Config, tables: list[TableConfig]) -> Config:
    """A copy of ``cfg`` that trains a model of the user's own whose EmbeddingBagCollection
    holds ``tables``, validated whole: the config's tables are those (or it gives none)."""
    if cfg.models:
        raise ConfigError("models: a multi-model run trains built-in models through "
                          "`cosparse train`; cosparse.Trainer trains one model (drop models:)")
    if cfg.model.kind is not None:
        raise ConfigError(
            f"model.kind: '{cfg.model.kind}' names a built-in model, but cosparse.Trainer was "
            "given a model of its own; leave model.kind out (cosparse.load_config then leaves it "
            "unset)")
    out = copy.deepcopy(cfg)
    if not out.tables:
        out.tables = copy.deepcopy(tables)
    elif out.tables != tables:
        mine = {t.name: t for t in tables}
        theirs = {t.name: t for t in out.tables}
        differ = sorted(n for n in mine.keys() | theirs.keys() if mine.get(n) != theirs.get(n))
        raise ConfigError(
            f"tables: the config's tables differ from the model's EmbeddingBagCollection's "
            f"(tables {differ}); give them in one place: leave tables out of the config")
    return validate(out)
