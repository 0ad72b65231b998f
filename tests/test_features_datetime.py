"""The ``datetime`` transform over days, months and years: each calendar field against Python's
own calendar, from a strptime format, unix seconds and milliseconds, and ISO 8601; bad
values and bad parameters named."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from cosparse.data import DataError
from cosparse.features import parse_spec
from cosparse.features.transforms.time import DATETIME, calendar, seconds
from cosparse.features.types import Column, FeatureSpecError

# every 7 hours and 13 minutes over ~200 days: every hour, weekday, day and month boundary
TIMES = [dt.datetime(2014, 10, 21, tzinfo=dt.UTC) + dt.timedelta(minutes=433 * i)
         for i in range(700)]
SECS = np.array([int(t.timestamp()) for t in TIMES], np.int64)


def test_each_field_matches_pythons_calendar():
    assert calendar(SECS, "hour_of_day").tolist() == [t.hour for t in TIMES]
    assert calendar(SECS, "day_of_week").tolist() == [t.weekday() for t in TIMES]
    assert calendar(SECS, "day_of_month").tolist() == [t.day for t in TIMES]
    assert calendar(SECS, "month").tolist() == [t.month for t in TIMES]
    since = dt.date(2014, 10, 1)
    assert calendar(SECS, "days_since", "2014-10-01").tolist() == \
        [(t.date() - since).days for t in TIMES]
    assert len(set(calendar(SECS, "month").tolist())) == 8  # (the span reaches into 8 months)


@pytest.mark.parametrize("fmt, col", [
    ("unix_s", Column.ints(SECS)),
    ("unix_ms", Column.ints(SECS * 1000 + 999)),
    ("%y%m%d%H", Column.ints(np.array([int(t.strftime("%y%m%d%H")) for t in TIMES]))),
    ("%Y-%m-%d %H:%M", Column.strings([t.strftime("%Y-%m-%d %H:%M") for t in TIMES])),
    ("iso8601", Column.strings([t.strftime("%Y-%m-%dT%H:%M:%S") for t in TIMES])),
])
def test_every_format_reads_the_same_hours(fmt, col):
    got = DATETIME.apply({"format": fmt, "emit": "hour_of_day"}, [col], None)
    assert got.values.tolist() == [t.hour for t in TIMES] and got.categorical
    assert seconds(col, fmt)[0] // 3600 == SECS[0] // 3600


def test_missing_values_stay_missing_and_a_bad_one_is_named():
    col = Column.strings(["2014-10-21", None, "2015-01-02T03:04:05"])
    got = DATETIME.apply({"format": "iso8601", "emit": "month"}, [col], None)
    assert got.values.tolist()[::2] == [10, 1] and got.present.tolist() == [True, False, True]
    with pytest.raises(DataError, match="datetime: 'yesterday' is not a time in format 'iso8601'"):
        DATETIME.apply({"format": "iso8601", "emit": "month"},
                       [Column.strings(["yesterday"])], None)


def _spec(params: dict, kind: str = "sparse") -> dict:
    feature = {"name": "when", "inputs": ["ts"], "kind": kind,
               "transforms": [{"datetime": params}]}
    if kind == "sparse":
        feature["table"] = "t"
    return {"features": [feature],
            "models": [{"name": "m", "consumes": ["when"]}]}


def test_in_a_spec_fields_are_ids_and_days_since_is_a_number():
    parse_spec(_spec({"format": "unix_s", "emit": "day_of_week"})).check_source({"ts": "int"})
    parse_spec(_spec({"format": "unix_s", "emit": "days_since", "since": "2014-01-01"},
                     "dense")).check_source({"ts": "int"})
    with pytest.raises(FeatureSpecError, match="declared dense but its values are IDs"):
        parse_spec(_spec({"format": "unix_s", "emit": "month"}, "dense")
                   ).check_source({"ts": "int"})
    with pytest.raises(FeatureSpecError, match="emit must be one of"):
        parse_spec(_spec({"format": "unix_s", "emit": "week"}))
    with pytest.raises(FeatureSpecError, match="days_since needs since"):
        parse_spec(_spec({"format": "unix_s", "emit": "days_since"}))
    with pytest.raises(FeatureSpecError, match="format unix_s needs an int column"):
        parse_spec(_spec({"format": "unix_s", "emit": "month"})).check_source({"ts": "string"})
