"""The configuration error: a setting that cannot work, named by its dotted key."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration problem, with the dotted key that causes it."""
