"""Mappings (parsed YAML) to the config dataclasses, checking every value against its field's
type; unknown keys are refused with the nearest known one."""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from typing import Any, Literal

from cosparse.config.errors import ConfigError


def from_dict(cls: type, data: Any, key: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys by their dotted name."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{key or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    renamed: dict[str, str] = getattr(cls, "YAML_NAMES", {})  # a YAML key that is a keyword
    kwargs = {}
    for yaml_key, v in data.items():
        full = f"{key}.{yaml_key}" if key else str(yaml_key)
        k = renamed.get(yaml_key, yaml_key)
        if k not in names:
            close = difflib.get_close_matches(str(k), names, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"unknown key '{full}'{hint}; known keys: {', '.join(names)}")
        kwargs[k] = _convert(hints[k], v, full)
    return cls(**kwargs)


def _convert(tp: Any, value: Any, key: str) -> Any:
    if tp is Any:  # (free-form values: model.args, the arguments of a model factory)
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return _convert_union(tp, args, value, key)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__}")
        return [_convert(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
        return {_convert(args[0], k, key): _convert(args[1], v, f"{key}.{k}")
                for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        short = getattr(tp, "FROM_STRING", None)  # a scalar that names one field of it
        if short is not None and isinstance(value, str):
            value = {short: value}
        return from_dict(tp, value, key)
    if tp is float:
        return _convert_float(value, key)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported type {tp}")


def _convert_union(tp: Any, args: tuple[Any, ...], value: Any, key: str) -> Any:
    if value is None and type(None) in args:
        return None
    errors = []
    for a in args:
        if a is type(None):
            continue
        try:
            return _convert(a, value, key)
        except ConfigError as e:
            errors.append(str(e))
    raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: {value!r} fits none of {tp}")


def _convert_float(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if isinstance(value, int) and abs(value) > 2**63:
        raise ConfigError(f"{key}: {value} is out of range")
    if not math.isfinite(value):
        raise ConfigError(f"{key}: expected a finite number, got {value!r}")
    return float(value)
