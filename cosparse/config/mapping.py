"""Raw config mappings (parsed YAML, before they become dataclasses): dotted-key overrides and
deep merges."""

from __future__ import annotations

from typing import Any

from cosparse.config.errors import ConfigError


def set_dotted(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Set dotted keys (``train.steps``) in a config mapping, in place; returns it."""
    for dotted, value in overrides.items():
        node = raw
        parts = dotted.split(".")
        for i, part in enumerate(parts[:-1]):
            if node.get(part) is None:  # absent, or an empty YAML section
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                raise ConfigError(f"{'.'.join(parts[: i + 1])}: expected a mapping, got "
                                  f"{type(node).__name__} (setting {dotted})")
        node[parts[-1]] = value
    return raw


def merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``, mapping by mapping: a key of ``top`` wins (a new dict)."""
    out = dict(base)
    for k, v in top.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def drop_keys(raw: dict[str, Any], keys: dict[str, Any]) -> None:
    """Remove from ``raw``, in place, every leaf key that the nested mapping ``keys`` has."""
    for k, v in keys.items():
        if not isinstance(v, dict):
            raw.pop(k, None)
        elif isinstance(raw.get(k), dict):
            drop_keys(raw[k], v)
