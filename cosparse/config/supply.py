"""The ``supply`` section: how rows reach the trainer, and its rules: the store each path needs,
and no setting that the path would ignore."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from cosparse.config.errors import ConfigError

if TYPE_CHECKING:
    from cosparse.config.root import Config


@dataclass
class SupplyConfig:
    # resident: every row in this process, in the local tiers (all on the device without a
    #   device capacity); no PS
    # ps-tiered: the local tiers over the parameter server: host victims are written to the PS
    #   and the trainer fetches its misses from it (B's tiers with A's supply)
    # ps-direct: architecture A, rows on the parameter server, pulled and pushed every step
    # collaborative: architecture B, data workers deliver the cold rows from the PS with the batch
    path: Literal["resident", "ps-tiered", "ps-direct", "collaborative"] = "resident"
    lookahead: int = 1  # plan and pin this many batches ahead on a background thread (0: inline)
    horizon: int = 0  # batches read beyond the lookahead whose rows eviction passes over
    # collaborative only:
    fallback: Literal["ps-direct"] | None = None  # on a run-time failure, the trainer pulls itself
    publish_every: int = 1  # steps between two publications of the resident filter
    publish_timeout_s: float = 30.0  # a filter request unserved this long is a failure
    max_stale_rate: float = 0.5  # stale drops / delivered rows (over 2000+ rows) above: failure
    filter_bits_per_row: int = 10  # resident-filter size per row of device + host capacity


def validate_supply(cfg: Config) -> None:
    """The store that ``supply.path`` needs, and no supply or store setting it would ignore."""
    sp = cfg.supply
    if sp.path == "resident":
        _validate_resident(cfg)
    elif sp.path == "ps-direct":
        _validate_ps_direct(cfg)
    else:
        _validate_tiers_over_ps(cfg)
    if sp.path != "collaborative" and sp.fallback is not None:
        raise ConfigError(f"supply.fallback: only supply.path 'collaborative' falls back "
                          f"(this run is '{sp.path}')")
    if cfg.store.admit_after > 1 and sp.path in ("ps-direct", "collaborative"):
        raise ConfigError(f"store.admit_after: not supported with supply.path '{sp.path}'")
    if sp.horizon and (sp.path == "ps-direct" or not cfg.store.tiered):
        which = (f"supply.path '{sp.path}'" if sp.path == "ps-direct"
                 else "all-resident tables (no store.device.rows or budget_bytes)")
        raise ConfigError(f"supply.horizon: only tiered tables steer eviction by the batches "
                          f"ahead; {which} would ignore it (remove supply.horizon)")


def _validate_resident(cfg: Config) -> None:
    """Every row stays in this process: no PS beneath the host tier."""
    if cfg.store.host.spill_to == "remote":
        raise ConfigError("store.host.spill_to: 'remote' puts the PS beneath the host tier, but "
                          "supply.path 'resident' keeps every row in this process; set "
                          "supply.path: ps-tiered for the tiers over the PS, or spill_to: memory")


def _validate_ps_direct(cfg: Config) -> None:
    """Architecture A: a device cache at most, over the PS."""
    host = cfg.store.host
    if host.rows is not None or host.budget_bytes is not None or host.spill:
        raise ConfigError("store.host: supply.path 'ps-direct' keeps rows on the device cache "
                          "and the PS only; remove store.host")


def _validate_tiers_over_ps(cfg: Config) -> None:
    """``ps-tiered`` and ``collaborative``: a device tier over a host tier whose victims go to
    the PS (bounded, for B: the cold rows live on the PS)."""
    path, store, host = cfg.supply.path, cfg.store, cfg.store.host
    if not store.tiered:
        raise ConfigError(f"store.device: supply.path '{path}' needs a device capacity "
                          "(store.device.budget_bytes or rows)")
    if path == "collaborative" and host.rows is None and host.budget_bytes is None:
        raise ConfigError("store.host: supply.path 'collaborative' needs a bounded host tier "
                          "(store.host.rows or budget_bytes): the cold rows live on the PS")
    if not host.spill or host.spill_to != "remote":
        raise ConfigError(f"store.host.spill/spill_to: supply.path '{path}' writes host "
                          "victims to the PS: set spill: true and spill_to: remote")
