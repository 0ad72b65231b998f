"""``data.eval_path``: train on all of ``data.path`` and evaluate on another file, instead of a split.
Its rules: a file reader that reads one (csv, parquet, libsvm, criteo_tsv, interactions), no
``data.split`` and no ``data.eval_fraction`` beside it (each names the eval rows another way), and
no stream (a stream validates progressively).

``data.eval_fraction`` has a default, so whether a config set it is known only from the mapping
it was read from: ``refuse_fraction_beside_eval_path`` checks that, before the dataclasses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cosparse.config.errors import ConfigError

if TYPE_CHECKING:
    from cosparse.config.data import DataConfig

EVAL_FILE_READERS = ("csv", "parquet", "libsvm", "criteo_tsv", "interactions")


def validate_eval_path(d: DataConfig) -> None:
    """``data.eval_path`` with a reader that reads one, and nothing else naming eval rows."""
    if d.eval_path is None:
        return
    if d.reader not in EVAL_FILE_READERS:
        raise ConfigError(f"data.eval_path: reader '{d.reader}' does not read an eval file "
                          f"(readers {', '.join(EVAL_FILE_READERS)} do)")
    if d.split is not None:
        raise ConfigError("data.eval_path and data.split: both name the eval rows; keep one "
                          "(data.eval_path evaluates on its file, data.split on a part of "
                          "data.path)")
    if d.stream is not None:
        raise ConfigError("data.eval_path and data.stream: a stream validates progressively, "
                          "on each batch before it trains; drop data.eval_path")


def refuse_fraction_beside_eval_path(raw: Any) -> None:
    """A config mapping that sets both ``data.eval_path`` and ``data.eval_fraction``."""
    data = raw.get("data") if isinstance(raw, dict) else None
    if isinstance(data, dict) and data.get("eval_path") is not None \
            and data.get("eval_fraction") is not None:
        raise ConfigError("data.eval_path and data.eval_fraction: both name the eval rows; "
                          "keep one (data.eval_path evaluates on its file, "
                          "data.eval_fraction on the tail of data.path)")
