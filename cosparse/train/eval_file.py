"""The readers of ``data.eval_path``: all of ``data.path`` trains and all of the eval file
evaluates (no split), checked against each other: the eval file has the ID columns of the
training file, of the same kind (an int and its text never hash to one ID), and the start-up
line says how many rows each side has.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from cosparse.config import ConfigError, DataConfig
from cosparse.data import make_reader
from cosparse.data.errors import DataError
from cosparse.data.reader import Reader
from cosparse.features.types import STRING_KINDS


def file_readers(data: DataConfig) -> tuple[Reader, Reader]:
    """(train, eval) readers of a reader of its own (criteo_tsv, parquet without columns):
    split by ``data.eval_fraction``, or the two files of ``data.eval_path``."""
    if data.eval_path is None:
        return make_reader(data, "train"), make_reader(data, "eval")
    whole = dataclasses.replace(data, eval_fraction=0.0)
    return (make_reader(whole, "train"),
            make_reader(dataclasses.replace(whole, path=data.eval_path, shuffle=None), "train"))


def eval_file_line(data: DataConfig, train: Any, eval_: Any) -> str:
    """The start-up line of a run with ``data.eval_path``, once the eval file's columns are
    checked against the training file's (a DataError naming the eval file and the column)."""
    mine, theirs = dict(train.columns), dict(eval_.columns)
    for name, kind in mine.items():
        if name not in theirs:
            raise DataError(f"{data.eval_path}: no column '{name}', which {data.path} has "
                            "(data.eval_path must have the training file's columns)")
        if (kind in STRING_KINDS) != (theirs[name] in STRING_KINDS):
            raise ConfigError(f"data.eval_path: column '{name}' holds {theirs[name]} values in "
                              f"{data.eval_path} and {kind} in {data.path}, which never hash "
                              f"to one ID; read both as one type (data.schema: {{{name}: "
                              "string})")
    rows = [getattr(s, "num_rows", None) for s in (train, eval_)]
    said = [f"{n:,} rows" if n is not None else "every row" for n in rows]
    return (f"data.eval_path: training on {said[0]} of {data.path}, evaluating on {said[1]} "
            f"of {data.eval_path}")
