"""The ``datetime`` transform: a timestamp column to one calendar field, in UTC.

``format``: a strptime format of text or integer columns (``"%y%m%d%H"`` reads Avazu's hour
14102100; an integer is read as its decimal text), ``unix_s`` or ``unix_ms`` (integers), or
``iso8601`` (``YYYY-MM-DD``, with ``THH:MM:SS`` or `` HH:MM:SS``; no zone offset).
``emit``: ``hour_of_day`` (0-23), ``day_of_week`` (Monday 0), ``day_of_month`` (1-31),
``month`` (1-12), all IDs, or ``days_since`` (whole days after ``since``, a ``YYYY-MM-DD``
date; a number, so it may be dense). Parsing is pyarrow compute's, over the whole batch; a
value that does not parse is a DataError naming it and the format.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cosparse.data.errors import DataError
from cosparse.features.transforms.base import BadParam, Mismatch, Param, TransformDef, one_input
from cosparse.features.types import INT, STRING, ColType, Column, is_list

EMITS = ("hour_of_day", "day_of_week", "day_of_month", "month", "days_since")
NUMERIC_FORMATS = ("unix_s", "unix_ms")
_ISO = ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d")


def _norm(p: dict[str, Any], base: Path | None) -> dict[str, Any]:
    if p["emit"] not in EMITS:
        raise BadParam(f"emit must be one of {', '.join(EMITS)}, got {p['emit']!r}")
    if p["emit"] == "days_since":
        try:
            np.datetime64(str(p.get("since")), "D")
        except ValueError:
            raise BadParam(f"days_since needs since: a YYYY-MM-DD date, got "
                           f"{p.get('since')!r}") from None
    return p


def _check(p: dict[str, Any], types: list[ColType]) -> ColType:
    t = one_input(types, "datetime")
    if is_list(t.kind) or t.kind not in (INT, STRING) or t.categorical:
        raise Mismatch(f"datetime needs an int or string column of times, got {t.kind}"
                       f"{' IDs' if t.categorical else ''}")
    if p["format"] in NUMERIC_FORMATS and t.kind != INT:
        raise Mismatch(f"datetime format {p['format']} needs an int column, got {t.kind}")
    return ColType(INT, p["emit"] != "days_since")


def _text(col: Column) -> pa.Array:
    if col.kind == INT:
        return pa.array(col.values).cast(pa.string())
    return pa.LargeStringArray.from_buffers(
        col.num_rows, pa.py_buffer(np.ascontiguousarray(col.offsets)),
        pa.py_buffer(np.ascontiguousarray(col.values)))


def seconds(col: Column, fmt: str) -> np.ndarray:
    """Unix seconds of every row (0 where the value is missing)."""
    present = col.present_mask()
    if fmt in NUMERIC_FORMATS:
        v = col.values.astype(np.int64)
        return np.where(present, v // 1000 if fmt == "unix_ms" else v, 0)
    text = _text(col)
    ts = None
    for f in (_ISO if fmt == "iso8601" else (fmt,)):
        got = pc.strptime(text, format=f, unit="s", error_is_null=True)
        ts = got if ts is None else pc.coalesce(ts, got)
    bad = present & np.asarray(ts.is_null().to_numpy(zero_copy_only=False), np.bool_)
    if bad.any():
        value = text[int(np.flatnonzero(bad)[0])].as_py()
        raise DataError(f"datetime: {value!r} is not a time in format {fmt!r}")
    secs = np.asarray(ts.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False), np.int64)
    return np.where(present, secs, 0)


def calendar(secs: np.ndarray, emit: str, since: str | None = None) -> np.ndarray:
    """One calendar field of unix seconds (UTC)."""
    days = np.floor_divide(secs, 86400)
    if emit == "hour_of_day":
        return np.floor_divide(np.mod(secs, 86400), 3600)
    if emit == "day_of_week":
        return np.mod(days + 3, 7)  # 1970-01-01 was a Thursday
    if emit == "days_since":
        return days - np.datetime64(str(since), "D").astype(np.int64)
    d = days.astype("datetime64[D]")
    months = d.astype("datetime64[M]")
    if emit == "month":
        return np.mod(months.astype(np.int64), 12) + 1
    return (d - months.astype("datetime64[D]")).astype(np.int64) + 1  # day_of_month


def _apply(p: dict[str, Any], cols: list[Column], state: Any) -> Column:
    c = cols[0]
    out = calendar(seconds(c, p["format"]), p["emit"], p.get("since"))
    return Column(INT, out.astype(np.int64), c.present, None, None, p["emit"] != "days_since")


DATETIME = TransformDef(
    "datetime",
    {"format": Param((str,), required=True), "emit": Param((str,), required=True),
     "since": Param((str,))},
    _check, _apply, normalize=_norm)
