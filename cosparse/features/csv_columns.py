"""CSV text columns to typed ``Column``s, vectorised over Arrow string arrays, with the rows
whose text does not fit the type (a bad record) marked rather than raised.

Arrow's CSV conversion fails a whole chunk on one bad cell and cannot skip it, so every column
is read as text and converted here: a regex check and a cast per column, in pyarrow compute.
Integers that overflow int64 are never wrapped: ``uint64`` keeps all 64 bits (as int64's bit
pattern, so hashing them is exact), and a value outside its type is a bad record naming it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cosparse.features.types import (
    FLOAT,
    INT,
    LIST_INT,
    LIST_STRING,
    STRING,
    Column,
    ColumnKind,
    from_arrow_strings,
)

KIND_OF: dict[str, ColumnKind] = {"int64": INT, "uint64": INT, "float32": FLOAT,
                                  "string": STRING, "list<int64>": LIST_INT,
                                  "list<string>": LIST_STRING}
NAME_OF_KIND: dict[ColumnKind, str] = {INT: "int64", FLOAT: "float32", STRING: "string",
                                       LIST_INT: "list<int64>", LIST_STRING: "list<string>",
                                       "list_float": "list<float32>"}
_INT = r"^[+-]?[0-9]+$"
_UINT = r"^\+?[0-9]+$"
_FLOAT = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"
_LIMITS = {"int64": (19, "9223372036854775807"), "uint64": (20, "18446744073709551615")}


def _mask(arr: pa.Array) -> np.ndarray:
    return np.asarray(arr.to_numpy(zero_copy_only=False), np.bool_)


def _present(arr: pa.Array) -> np.ndarray:
    """Rows holding text (a null or an empty cell is missing)."""
    return _mask(pc.fill_null(pc.greater(pc.binary_length(arr), 0), False))


def _matches(arr: pa.Array, pattern: str) -> np.ndarray:
    return _mask(pc.fill_null(pc.match_substring_regex(arr, pattern), False))


def _in_range(arr: pa.Array, type_name: str) -> np.ndarray:
    """Integer text no longer than the type's largest value, digit for digit."""
    digits = pc.utf8_ltrim(arr, "+-")
    width, top = _LIMITS[type_name]
    length = pc.utf8_length(digits)
    short = pc.less(length, width)
    same = pc.and_(pc.equal(length, width), pc.less_equal(digits, pa.scalar(top, arr.type)))
    return _mask(pc.fill_null(pc.or_(short, same), False))


def _ints(arr: pa.Array, type_name: str, ok: np.ndarray) -> np.ndarray:
    clean = pc.if_else(pa.array(ok), arr, pa.scalar("0", arr.type))
    if type_name == "uint64":
        return np.asarray(clean.cast(pa.uint64()).to_numpy(zero_copy_only=False)).view(np.int64)
    return np.asarray(clean.cast(pa.int64()).to_numpy(zero_copy_only=False), np.int64)


def convert(arr: pa.Array, type_name: str, list_separator: str) -> tuple[Column, np.ndarray]:
    """(Column, bad rows) of one text column (large_string, nulls where the text was a null
    value) read as ``type_name``."""
    n = len(arr)
    present = _present(arr)
    if type_name == "string":
        return _strings(arr, present), np.zeros(n, np.bool_)
    if type_name in ("list<int64>", "list<string>"):
        return _lists(arr, type_name, present, list_separator)
    if type_name == "float32":
        ok = present & _matches(arr, _FLOAT)
        clean = pc.if_else(pa.array(ok), arr, pa.scalar("0", arr.type))
        v = np.asarray(clean.cast(pa.float64()).to_numpy(zero_copy_only=False), np.float64)
        return Column(FLOAT, v, None if ok.all() else ok), present & ~ok
    pattern = _UINT if type_name == "uint64" else _INT
    ok = present & _matches(arr, pattern)
    ok &= _in_range(arr, type_name)
    return Column(INT, _ints(arr, type_name, ok), None if ok.all() else ok), present & ~ok


def _strings(arr: pa.Array, present: np.ndarray) -> Column:
    return from_arrow_strings(pc.if_else(pa.array(present), arr, pa.scalar(None, arr.type)))


def _lists(arr: pa.Array, type_name: str, present: np.ndarray, sep: str
           ) -> tuple[Column, np.ndarray]:
    """Split on ``sep``; a missing cell is an empty list."""
    text = pc.if_else(pa.array(present), arr, pa.scalar(None, arr.type))
    parts = pc.split_pattern(text, sep)
    lengths = np.asarray(parts.value_lengths().fill_null(0).to_numpy(zero_copy_only=False),
                         np.int64)
    flat = parts.flatten()
    if type_name == "list<string>":
        return from_arrow_strings(flat, lengths), np.zeros(len(arr), np.bool_)
    ok = _matches(flat, _INT) & _in_range(flat, "int64")
    bad = np.zeros(len(arr), np.bool_)
    if not ok.all():
        bad[np.repeat(np.arange(len(arr)), lengths)[~ok]] = True
    return Column(LIST_INT, _ints(flat, "int64", ok), None, lengths), bad


def labels(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(labels float32, bad rows): a label is a number equal to 0 or 1."""
    ok = _present(arr) & _matches(arr, _FLOAT)
    clean = pc.if_else(pa.array(ok), arr, pa.scalar("-1", arr.type))
    v = np.asarray(clean.cast(pa.float64()).to_numpy(zero_copy_only=False), np.float64)
    bad = (v != 0.0) & (v != 1.0)
    return np.where(bad, 0.0, v).astype(np.float32), bad


def infer(arrow_type: pa.DataType, text: pa.Array) -> str:
    """The column type of a column that Arrow inferred ``arrow_type`` for from its first rows'
    ``text``: integers that fit int64 are int64, larger ones uint64, and whole numbers past
    uint64 (which Arrow takes for floats) string; floats float32; anything else string."""
    if pa.types.is_integer(arrow_type):
        return "uint64" if pa.types.is_uint64(arrow_type) else "int64"
    if not pa.types.is_floating(arrow_type):
        return "string"
    present = _present(text)
    if not (_matches(text, _INT) | ~present).all():
        return "float32"
    for name in ("int64", "uint64"):
        if (_in_range(text, name) | ~present).all() and (
                name == "int64" or (_matches(text, _UINT) | ~present).all()):
            return name
    return "string"
