"""``cosparse data describe``: a first look at a data file before any config exists: each
column's inferred type, estimated distinct values, null share and range, the label's balance,
and a ``data.columns`` block to start from.

Distinct values are estimated by a k-minimum-values sketch over the column's 63-bit hashes
(the IDs ``data.columns`` would give them): exact below ``SKETCH_K`` distinct values, within a
few percent above (relative error about 1/sqrt(k)). No library here does this over our Column
layout without a per-value Python loop, and it is a dozen lines of numpy.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cosparse.config import LabelConfig
from cosparse.config.labels import as_label
from cosparse.features import kernels as K
from cosparse.features.column_map import column_ids, column_seed
from cosparse.features.label_map import column_labels
from cosparse.features.sources import RawSource
from cosparse.features.types import FLOAT, INT, Column

SKETCH_K = 4096
LABEL_NAMES = ("label", "click", "clicked", "is_click", "target", "y", "conversion")


class DistinctSketch:
    """The ``k`` smallest distinct hashes seen (non-negative int64 over [0, 2**63))."""

    def __init__(self, k: int = SKETCH_K) -> None:
        self.k = k
        self.smallest = np.zeros(0, np.int64)

    def update(self, hashes: np.ndarray) -> None:
        if len(hashes):
            self.smallest = np.union1d(self.smallest, hashes)[: self.k]

    def estimate(self) -> float:
        if len(self.smallest) < self.k:
            return float(len(self.smallest))
        return (self.k - 1) * 2.0**63 / float(self.smallest[-1] + 1)


@dataclass
class ColumnStats:
    """What ``describe`` learns of one column."""

    name: str
    type: str
    rows: int = 0
    nulls: int = 0
    sketch: DistinctSketch = field(default_factory=DistinctSketch)
    low: float = float("inf")
    high: float = float("-inf")
    zero_one: bool = True  # every value present is 0 or 1
    ones: int = 0  # values equal to 1 (a label's positives; by ``rule`` when it maps them)
    rule: LabelConfig | None = None  # the label's mapping to 0/1 (data.columns.label)
    mapped_ones: int = 0  # the positives by ``rule``
    unmapped: int = 0  # values present that ``rule`` cannot map (bad records)

    def update(self, col: Column) -> None:
        present = col.present_mask() if col.lengths is None else col.lengths > 0
        self.rows += len(present)
        self.nulls += int(len(present) - np.count_nonzero(present))
        if col.kind == FLOAT:  # (hashing a float's bits: column_ids would truncate it)
            ids = K.hash_ints(col.values.view(np.int64)[col.present_mask()], 0, 0)
        else:
            ids, _ = column_ids(col, column_seed(0, self.name))
        self.sketch.update(ids)
        if col.kind in (INT, FLOAT) and col.lengths is None:
            v = col.values[present]
            if self.type == "uint64":  # (its 64 bits are held in int64)
                v = v.view(np.uint64)
            if len(v):
                self.low = min(self.low, float(v.min()))
                self.high = max(self.high, float(v.max()))
                self.zero_one &= bool(np.isin(v, (0, 1)).all())
                self.ones += int(np.count_nonzero(v == 1))
        else:
            self.zero_one = False
        if self.rule is not None and self.rule.mapped:
            labels, bad = column_labels(col, self.rule)
            self.mapped_ones += int(labels.sum())
            self.unmapped += int(np.count_nonzero(bad & present))


def describe_source(source: RawSource, types: dict[str, str], max_rows: int | None = None,
                    progress: Callable[[int], None] | None = None,
                    label: LabelConfig | None = None) -> list[ColumnStats]:
    """One pass over ``source`` (its first ``max_rows`` rows when set; ``label``: the label
    column and its mapping, whose positives are counted by it)."""
    stats = {c: ColumnStats(c, types.get(c, kind), rule=label if label and c == label.column
                            else None) for c, kind in source.columns.items()}
    seen = 0
    for task in source.tasks():
        raw = source.build_raw(task)
        for c, col in raw.columns.items():
            stats[c].update(col)
        seen += raw.num_rows
        if progress is not None:
            progress(seen)
        if max_rows is not None and seen >= max_rows:
            break
    return list(stats.values())


def guess_label(stats: list[ColumnStats]) -> ColumnStats | None:
    """A 0/1 column, by a label's usual name first."""
    binary = [s for s in stats if s.zero_one and s.rows > s.nulls]
    named = [s for s in binary if s.name.lower() in LABEL_NAMES]
    return (named or binary or [None])[0]


def time_format(s: ColumnStats) -> str | None:
    """The ``datetime`` format of an integer column that looks like times: unix seconds or
    milliseconds (1980 to 2033), YYYYMMDD, or YYMMDDHH when its name says hour."""
    if s.type != "int64" or s.low > s.high:
        return None
    for fmt, lo, hi in (("unix_s", 315_532_800, 2_000_000_000),
                        ("unix_ms", 315_532_800_000, 2_000_000_000_000),
                        ("%Y%m%d", 19_000_101, 21_001_231)):
        if lo <= s.low and s.high <= hi:
            return fmt
    if "hour" in s.name.lower() and 10_000_000 <= s.low and s.high <= 99_123_123:
        return "%y%m%d%H"
    return None


def suggest_columns(stats: list[ColumnStats], label: str | None,
                    rule: LabelConfig | None = None) -> dict[str, Any]:
    """A ``data.columns`` block: floats dense, integer times to calendar fields, columns with
    a distinct value nearly every row (row IDs: nothing to learn) dropped, the rest sparse."""
    rows = max((s.rows for s in stats), default=0)
    dense = [s.name for s in stats if s.name != label and s.type in ("float32", FLOAT)]
    times = {s.name: f for s in stats if s.name != label and (f := time_format(s))}
    drop = [s.name for s in stats if s.name != label and s.name not in dense
            and s.name not in times
            and rows >= 100 and s.sketch.estimate() >= 0.9 * (s.rows - s.nulls)]
    out: dict[str, Any] = {"label": _label_yaml(rule) if rule and rule.mapped
                           else label or "label"}
    if dense:
        out["dense"] = dense
    if drop:
        out["drop"] = drop
    out["sparse"] = "auto"
    if times:
        out["datetime"] = {c: {"format": f, "emit": ["hour_of_day", "day_of_week"]}
                           for c, f in times.items()}
    return out


def format_report(stats: list[ColumnStats], label: ColumnStats | None, path: str,
                  suggestion: dict[str, Any]) -> str:
    rows = max((s.rows for s in stats), default=0)
    width = max([len(s.name) for s in stats] + [6])
    lines = [f"{path}: {rows:,} rows, {len(stats)} columns", "",
             f"{'column':<{width}}  {'type':<12} {'distinct':>10} {'null':>6}  range"]
    for s in stats:
        est = s.sketch.estimate()
        distinct = f"{est:,.0f}" if len(s.sketch.smallest) < s.sketch.k else f"~{est:,.0f}"
        rng = f"{s.low:g} .. {s.high:g}" if s.low <= s.high else ""
        share = s.nulls / s.rows if s.rows else 0.0
        lines.append(f"{s.name:<{width}}  {s.type:<12} {distinct:>10} {share:>6.1%}  {rng}")
    lines.append("")
    if label is None:
        lines.append("label: no 0/1 column found (set data.columns.label)")
    else:
        lines.append(f"label: {label.name}, {label_balance(label)}")
    lines += ["", "a data.columns block to start from:", "", "data:", "  columns:"]
    for k, v in suggestion.items():
        if isinstance(v, dict):
            lines.append(f"    {k}:")
            lines += [f"      {c}: {{format: {_quoted(d['format'])}, emit: [{', '.join(d['emit'])}]}}"
                      for c, d in v.items()]
        else:
            lines.append(f"    {k}: {v if isinstance(v, str) else '[' + ', '.join(v) + ']'}")
    return "\n".join(lines)


def _label_yaml(rule: LabelConfig) -> str:
    how = (f"threshold: {rule.threshold:g}" if rule.threshold is not None
           else f"positive: [{', '.join(map(str, rule.positive or []))}]")
    return f"{{column: {rule.column}, {how}}}"


def _quoted(fmt: str) -> str:
    return f'"{fmt}"' if "%" in fmt else fmt


def label_balance(label: ColumnStats) -> str:
    present = label.rows - label.nulls
    if label.rule is None or not label.rule.mapped:
        return f"{label.ones / max(present, 1):.1%} positive ({label.ones:,} of {present:,})"
    mapped = present - label.unmapped
    line = (f"{label.mapped_ones / max(mapped, 1):.1%} positive ({label.mapped_ones:,} of "
            f"{mapped:,}; {label.rule.describe()})")
    return line + (f"; {label.unmapped:,} values it cannot map (bad records)"
                   if label.unmapped else "")


def run_describe(source: RawSource, types: dict[str, str], path: str,
                 label: str | LabelConfig | None, max_rows: int | None,
                 progress: bool = True) -> str:
    """The report of ``cosparse data describe`` (see the module docstring); ``label``: the
    config's label column (and its mapping to 0/1), None to guess a 0/1 column."""
    def tick(seen: int) -> None:
        print(f"\rdescribe: {seen:,} rows", end="", file=sys.stderr, flush=True)

    rule = None if label is None else as_label(label)
    stats = describe_source(source, types, max_rows, tick if progress else None, rule)
    if progress:
        print(file=sys.stderr)
    chosen = (next((s for s in stats if s.name == rule.column), None) if rule
              else guess_label(stats))
    suggestion = suggest_columns(stats, chosen.name if chosen else rule and rule.column, rule)
    return format_report(stats, chosen, path, suggestion)
