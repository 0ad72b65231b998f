"""The feasibility check every tuning proposal passes before it is applied, shared by the live
agent (``train.autotune``) and the offline one (``cosparse tune``).

A proposal is infeasible when the configuration it makes is one the config's own validation
refuses, when its device tier would hold more rows than its host tier (start-up sizing and a
live resize refuse that), or when its tiers' bytes are over a budget or over this machine's
memory. The bytes counted are each tier's rows times every table's row width: what the trial's
figures count for a tier sized by ``rows`` (at least as much on architecture A's device
cache), so a proposal refused here could never have met the budget.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from cosparse.autotune.types import Budgets
from cosparse.config import Config, ConfigError, config_from_mapping, validate
from cosparse.config.train import AutotuneConfig
from cosparse.train.live import set_live
from cosparse.tune.tiers import row_bytes

# where each budget is set, for the reasons: the offline agent's flag by default
OFFLINE_KEYS = {"device": "cosparse tune --budget device=", "host": "cosparse tune --budget host="}
LIVE_KEYS = {"device": "train.autotune.device_budget", "host": "train.autotune.host_budget"}


def mapping_refusal(raw: dict[str, Any], budgets: Budgets,
                    keys: dict[str, str] = OFFLINE_KEYS) -> str | None:
    """Why the config mapping ``raw`` (a proposal applied to the start) is infeasible, or None."""
    try:
        cfg = config_from_mapping(copy.deepcopy(raw))
    except ConfigError as err:
        return f"the config validation refuses it: {err}"
    return tier_refusal(cfg, budgets, keys)


def live_refusal(start: Config, changes: dict[str, Any], budgets: Budgets,
                 keys: dict[str, str] = LIVE_KEYS) -> str | None:
    """Why the live knobs ``changes`` set on the configuration ``start`` are infeasible, or
    None (``start`` is left unchanged). ``train.autotune``'s own rules (which knobs the start
    may tune live) were checked on the start, and are not checked again."""
    cfg = copy.deepcopy(start)
    cfg.train.autotune = AutotuneConfig()
    try:
        set_live(cfg, changes)
        validate(cfg)
    except (ConfigError, ValueError) as err:
        return f"the config validation refuses it: {err}"
    return tier_refusal(cfg, budgets, keys)


def tier_refusal(cfg: Config, budgets: Budgets, keys: dict[str, str] = OFFLINE_KEYS) -> str | None:
    """Why the tiers of the validated ``cfg`` cannot be (device rows over host rows, bytes over
    a budget or over this machine's memory), or None."""
    store = cfg.store
    dev_rows, host_rows = store.device.rows, store.host.rows
    if not store.tiered:
        return None  # (all-resident tables, sized by their vocabulary)
    if dev_rows is not None and host_rows is not None and cfg.supply.path != "ps-direct" \
            and dev_rows > host_rows:
        return (f"store.device.rows {dev_rows} is over store.host.rows {host_rows}: the host "
                "tier must hold at least the device tier's rows")
    per_row = sum(row_bytes(t) for t in cfg.tables)
    held = {"device": None if dev_rows is None else dev_rows * per_row,
            "host": None if host_rows is None or cfg.supply.path == "ps-direct"
            else host_rows * per_row}
    for tier, limit in (("device", budgets.device_bytes), ("host", budgets.host_bytes)):
        rows, need = getattr(store, tier).rows, held[tier]
        if need is not None and limit is not None and need > limit:
            return (f"store.{tier}.rows {rows} x {per_row} bytes a row = {need:,} bytes is over "
                    f"the {tier} budget of {int(limit):,} bytes ({keys[tier]})")
    ram = _host_memory()
    in_ram = sum(v for k, v in held.items() if v is not None and (k == "host" or not _cuda(cfg)))
    if ram and in_ram > ram:
        return (f"the tiers need {in_ram:,} bytes of host memory, over this machine's "
                f"{ram:,} bytes (store.device.rows, store.host.rows)")
    gpu = _device_memory() if _cuda(cfg) else None
    if gpu and held["device"] is not None and held["device"] > gpu:
        return (f"store.device.rows {dev_rows} needs {held['device']:,} bytes, over the GPU's "
                f"{gpu:,} bytes")
    return None


def _cuda(cfg: Config) -> bool:
    import torch

    return cfg.train.device == "cuda" or (cfg.train.device == "auto" and
                                          torch.cuda.is_available())


def _host_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def _device_memory() -> int | None:
    import torch

    return int(torch.cuda.get_device_properties(0).total_memory) if torch.cuda.is_available() \
        else None
