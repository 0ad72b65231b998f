"""Data errors: bad input is reported with its file and line, never turned into silent garbage."""

from __future__ import annotations


class DataError(Exception):
    """A data problem: a missing or corrupt file, or a malformed record.

    Malformed-record messages start with ``path:line`` (1-based line number in the file) for text
    files, or ``path: row N`` for Parquet, followed by what was wrong.
    """
