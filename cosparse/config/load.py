"""Reading configs: a YAML file (or a mapping) with its overrides and preset, to a validated
``Config``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from cosparse.config.convert import from_dict
from cosparse.config.errors import ConfigError
from cosparse.config.eval_path import refuse_fraction_beside_eval_path
from cosparse.config.mapping import set_dotted
from cosparse.config.model import factory_exclusive_with_kind
from cosparse.config.presets import apply_preset
from cosparse.config.root import Config
from cosparse.config.validate import validate


def config_from_mapping(raw: dict[str, Any]) -> Config:
    """A validated Config from a mapping (its preset applied)."""
    refuse_fraction_beside_eval_path(raw)
    factory_exclusive_with_kind(raw)
    return validate(from_dict(Config, apply_preset(raw)))


def read_config_mapping(path: str | Path) -> dict[str, Any]:
    """The mapping of a YAML config file; a missing file or bad YAML names the file (and the
    line and column where YAML says)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        raw = yaml.safe_load(p.read_bytes()) or {}
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(p)
        raise ConfigError(f"{where}: not valid YAML: {e.problem or e.context}") from None
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: expected a mapping at the top level")
    return raw


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> Config:
    """Read a YAML config; ``overrides`` maps dotted keys (``train.steps``) to values."""
    return config_from_mapping(set_dotted(read_config_mapping(path), overrides or {}))
