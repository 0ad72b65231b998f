"""Table configurations that reach a shard from outside (REGISTER requests, snapshot manifests,
``ps serve --config``): validated by the training config's rules, and compared on what decides
a table's rows. ``NAME_RE`` is what a table, snapshot or file name may look like."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import yaml

from cosparse.config import ConfigError, TableConfig, from_dict
from cosparse.config.bounds import BOUNDS, INT64_MAX, INT64_MIN, numeric_leaves, pattern_of
from cosparse.config.store import PS_NAME_PATTERN

NAME_RE = re.compile(PS_NAME_PATTERN)


def table_config_from_dict(d: dict) -> TableConfig:
    """A TableConfig from plain JSON/YAML data (validated by the config loader's rules)."""
    cfg = from_dict(TableConfig, d, "table")
    if not cfg.name or not NAME_RE.match(cfg.name):
        raise ConfigError(f"table.name: {cfg.name!r} is not a valid table name")
    if cfg.dim <= 0:
        raise ConfigError("table.dim: must be positive")
    for key, v in numeric_leaves(cfg, "tables[0]"):  # the training config's ranges, over the wire
        bound = BOUNDS.get(pattern_of(key))
        if (isinstance(v, int) and not INT64_MIN <= v <= INT64_MAX) or (
                bound is not None and not bound.allows(v)):
            what = bound.describe() if bound is not None else "a 64-bit integer"
            raise ConfigError(f"table '{cfg.name}': {key.removeprefix('tables[0].')} must be "
                              f"{what}, got {v!r}")
    if cfg.init.kind == "uniform" and cfg.init.low > cfg.init.high:
        raise ConfigError(f"table '{cfg.name}': init.low {cfg.init.low} is above init.high "
                          f"{cfg.init.high}")
    return cfg


def tables_from_yaml(path: str | Path) -> list[TableConfig]:
    """The ``tables`` section of a cosparse YAML config (``ps serve --config``; other sections
    are ignored here)."""
    raw = yaml.safe_load(Path(path).read_text()) or {}
    tables = raw.get("tables") if isinstance(raw, dict) else None
    if not isinstance(tables, list):
        raise ConfigError(f"{path}: no 'tables' list")
    return [table_config_from_dict(t) for t in tables]


def canonical_config(cfg: TableConfig) -> dict:
    """The part of a table's config that decides its rows (what re-registering must match)."""
    d = dataclasses.asdict(cfg)
    d.pop("features", None)  # which features use a table does not change its rows
    d.pop("pooling", None)
    d.pop("policy", None)
    d.pop("num_embeddings", None)
    d.pop("rows_of", None)  # which rank's shard asks (row-wise sharding): the rows are the same
    d.pop("ps_name", None)  # (the name it has on the PS is ``name`` there)
    d.pop("shared_as", None)  # (so is the table a shared_as names)
    return d
