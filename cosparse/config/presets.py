"""Presets: named architectures (``resident``, ``arch-a``, ``arch-b``) that set the supply and
store switches. The one implementation: ``preset:`` in a config file, and the variants that
``cosparse compare`` runs.

Precedence: explicit keys win over the preset. In a config file those are the file's own keys;
in a compare variant (``switch_preset``) they are the variant's ``key=value`` overrides, because
switching a config to a preset first removes the config's own values of the keys that preset
sets. Either way, preset settings that the resulting ``supply.path`` contradicts are dropped.
"""

from __future__ import annotations

import copy
from typing import Any

from cosparse.config.errors import ConfigError
from cosparse.config.mapping import drop_keys, merge, set_dotted

PRESETS: dict[str, dict[str, Any]] = {
    "resident": {"supply": {"path": "resident"}},
    # A: rows on the PS, pulled and pushed each step; a write-through device cache when
    # store.device has a capacity; no host tier; double-buffered pulls
    "arch-a": {"supply": {"path": "ps-direct", "lookahead": 1},
               "store": {"device": {"policy": "hotness"}}},
    # B: device, host and PS tiers by hotness; workers deliver the cold rows; lookahead 4
    "arch-b": {"supply": {"path": "collaborative", "lookahead": 4, "fallback": "ps-direct"},
               "store": {"device": {"policy": "hotness"},
                         "host": {"policy": "lfu", "spill": True, "spill_to": "remote"}}},
}


def apply_preset(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` (a config mapping) over the defaults of its ``preset``: every key ``raw`` gives
    wins over the preset. A path that leaves the preset's architecture drops the preset
    settings it would contradict (ps-direct has no host tier; only collaborative falls back)."""
    name = raw.get("preset")
    if name is None:
        return raw
    preset = copy.deepcopy(_preset(name))
    for section in ("supply", "store"):
        if not isinstance(raw.get(section) or {}, dict):
            raise ConfigError(f"{section}: expected a mapping, got {type(raw[section]).__name__}")
    _drop_contradicted(preset, _path(raw, name))
    return merge(preset, raw)


def switch_preset(raw: dict[str, Any], name: str,
                  overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The config mapping ``raw`` switched to preset ``name``, then the dotted ``overrides``
    (a ``cosparse compare`` variant). The preset's switches replace the config's own, and the
    settings the new path has no use for go (a host tier under ps-direct, a fallback outside
    collaborative); the capacities, model, data and seed stay. The overrides win over all."""
    preset = _preset(name)
    out = copy.deepcopy(raw)
    out["preset"] = name
    drop_keys(out, preset)
    set_dotted(out, overrides or {})
    _drop_contradicted(out, _path(out, name))
    return apply_preset(out)


def _preset(name: Any) -> dict[str, Any]:
    if not isinstance(name, str) or name not in PRESETS:
        raise ConfigError(f"preset: {name!r} is not one of {', '.join(map(repr, PRESETS))}")
    return PRESETS[name]


def _path(raw: dict[str, Any], name: str) -> Any:
    """The supply path of ``raw`` over preset ``name``."""
    supply = raw.get("supply")
    if isinstance(supply, dict) and "path" in supply:
        return supply["path"]
    return PRESETS[name]["supply"]["path"]


def _drop_contradicted(raw: dict[str, Any], path: Any) -> None:
    """Remove, in place, what supply path ``path`` has no use for: a host tier under ps-direct,
    a fallback outside collaborative."""
    store, supply = raw.get("store"), raw.get("supply")
    if path == "ps-direct" and isinstance(store, dict):
        store.pop("host", None)
    if path != "collaborative" and isinstance(supply, dict):
        supply.pop("fallback", None)
