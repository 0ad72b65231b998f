"""Data errors: bad input is reported with its file and line, never turned into silent garbage."""

from __future__ import annotations


class DataError(Exception):
    """A data problem: a missing, empty or corrupt file, or a malformed record.

    Malformed-record messages start with ``path:line`` (1-based line number in the file) for text
    files, or ``path: row N (0-based)`` for Parquet, followed by the column and what was wrong.
    """


class DataLayoutError(DataError):
    """A file that the config's layout keys do not fit (empty, no header, another delimiter):
    no record is at fault, so the message names the file and the key to set."""


def empty_split_message(path: str, total: int, unit: str, eval_fraction: float) -> str:
    """The message of a training split with no records: an empty file, or one that
    ``data.eval_fraction`` leaves nothing of (a run would train 0 steps)."""
    if total == 0:
        return f"{path}: the data file has no {unit}: nothing to train on"
    return (f"{path}: the training split is empty: the file has {total} {unit} and "
            f"data.eval_fraction {eval_fraction} leaves none of them for training")
