"""Sizes written for people (``2GiB``, ``512MB``) read as bytes."""

from __future__ import annotations

import re

from cosparse.config.errors import ConfigError

_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_bytes(value: int | str, key: str) -> int:
    """``2GiB`` / ``512MB`` / ``1048576`` -> bytes."""
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*", str(value))
    if not m or m.group(2).upper() not in _SIZE_UNITS:
        raise ConfigError(f"{key}: cannot read {value!r} as a size (use e.g. 2GiB, 512MB, 1048576)")
    size = float(m.group(1)) * _SIZE_UNITS[m.group(2).upper()]
    if not size < 2**63:
        raise ConfigError(f"{key}: {value!r} is too large")
    return int(size)
