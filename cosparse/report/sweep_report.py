"""The HTML report of ``bench_ab.py --sweep``: B's throughput over A's in every cell (a bar chart,
1.0 is parity), and where B loses, with the reason read from the counters."""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from pathlib import Path
from typing import Any

from cosparse.report import svg
from cosparse.report.html import _CSS, fmt_ratio, section, table


def render_sweep(doc: Mapping[str, Any]) -> str:
    """The complete HTML5 document for a sweep's JSON."""
    cells: Mapping[str, Any] = doc.get("cells", {})
    groups = {name: {"B over A": c.get("b_over_a")} for name, c in cells.items()}
    chart = svg.bar_chart(groups, "samples/s, B over A (1.0: parity)", "B / A",
                          width=max(640, 48 * len(groups)), value_format=lambda v: f"{v:.2f}")
    rows = [(name, [str(c.get("factor")), str(c.get("value")),
                    fmt_ratio(c.get("b_over_a")) if c.get("error") is None else
                    f"not run: {c['error']}"]) for name, c in cells.items()]
    body = chart + table(["cell", "factor", "value", "B over A"], rows)
    loses = doc.get("where_b_loses", [])
    lose_rows = [(w["cell"], [fmt_ratio(w["b_over_a"]), w["reason"]]) for w in loses]
    lost = (table(["cell", "B over A", "why (from the counters)"], lose_rows) if lose_rows
            else '<p class="note">B was at least as fast as A in every cell.</p>')
    size = doc.get("size", {})
    head = (f"<header><h1>cosparse: where architecture B loses</h1><p class=\"note\">"
            f"{escape(str(doc.get('mode', '')))} sweep, {len(cells)} cells, workload {escape(str(size))}"
            "</p></header>")
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            "<title>cosparse A/B sweep</title>"
            f"<style>{_CSS}</style></head><body>{head}<main>"
            + section("b_over_a", "B over A, one factor at a time", body)
            + section("where_b_loses", "Where B loses", lost) + "</main></body></html>\n")


def write_sweep_report(doc: Mapping[str, Any], path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_sweep(doc), encoding="utf-8")
    return out
