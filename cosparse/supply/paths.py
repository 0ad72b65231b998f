"""The one factory of supply paths: the config names the path, this builds it."""

from __future__ import annotations

from collections.abc import Callable

from cosparse.config import Config
from cosparse.supply.collaborative.path import CollaborativePath
from cosparse.supply.local import LocalPath
from cosparse.supply.ps_paths import PSDirectPath, RemoteTierPath
from cosparse.supply.types import PathContext, SupplyPath

PATHS: dict[str, Callable[[Config, PathContext], SupplyPath]] = {
    "resident": LocalPath,  # all resident, or tiers over an in-process spill store
    "ps-tiered": RemoteTierPath,  # this process's tiers over the PS, misses pulled by the trainer
    "ps-direct": PSDirectPath,  # architecture A
    "collaborative": CollaborativePath,  # architecture B
}


def make_supply_path(cfg: Config, ctx: PathContext) -> SupplyPath:
    """The path ``supply.path`` names (validated by the config)."""
    return PATHS[cfg.supply.path](cfg, ctx)
