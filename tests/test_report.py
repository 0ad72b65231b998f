"""The compare report: parse the rendered HTML (stdlib ``HTMLParser``) and check structure and numbers."""

from __future__ import annotations

import copy
import math
from collections import Counter
from dataclasses import dataclass, field
from html.parser import HTMLParser

import pytest

from cosparse.report import render_report, write_report
from cosparse.report.html import SECTION_IDS
from cosparse.report.svg import bar_chart, line_chart

VOID = {"meta", "link", "br", "hr", "img", "input", "area", "base", "col", "embed", "source", "wbr"}


@dataclass
class Table:
    section: str | None
    head: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)

    def cell(self, row: str, col: str) -> str:
        """The cell in the row whose header is ``row``, in the column headed ``col``."""
        j = self.head.index(col)
        matches = [r for r in self.rows if r and r[0] == row]
        assert len(matches) == 1, (row, self.rows)
        return matches[0][j]


class Collector(HTMLParser):
    """Checks nesting and gathers, per section id: tag counts, text, tables; and every src/href."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, str | None]] = []  # (tag, enclosing section id)
        self.errors: list[str] = []
        self.section_ids: list[str] = []
        self.tags: dict[str | None, Counter[str]] = {}
        self.text: dict[str | None, list[str]] = {}
        self.tables: list[Table] = []
        self.refs: list[str] = []
        self.polyline_points: list[str] = []
        self._cell: list[str] | None = None

    @property
    def section(self) -> str | None:
        return self.stack[-1][1] if self.stack else None

    def _in(self, tag: str) -> bool:
        return any(t == tag for t, _ in self.stack)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._open(tag, dict(attrs))
        if tag not in VOID:
            sid = dict(attrs).get("id") if tag == "section" else self.section
            self.stack.append((tag, sid))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._open(tag, dict(attrs))

    def _open(self, tag: str, attrs: dict[str, str | None]) -> None:
        if tag == "section":
            self.section_ids.append(attrs.get("id") or "")
        sid = attrs.get("id") if tag == "section" else self.section
        self.tags.setdefault(sid, Counter())[tag] += 1
        self.refs += [v or "" for k, v in attrs.items() if k in ("src", "href")]
        if tag == "polyline":
            self.polyline_points.append(attrs.get("points") or "")
        if tag == "table":
            self.tables.append(Table(self.section))
        elif tag == "tr" and self._in("tbody"):
            self.tables[-1].rows.append([])
        elif tag in ("th", "td"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            return
        if not self.stack or self.stack[-1][0] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1][0] if self.stack else 'nothing'}")
            return
        if tag in ("th", "td") and self._cell is not None:
            text = "".join(self._cell).strip()
            if self._in("thead"):
                self.tables[-1].head.append(text)
            elif self._in("tbody"):
                self.tables[-1].rows[-1].append(text)
            self._cell = None
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.setdefault(self.section, []).append(data)
        if self._cell is not None:
            self._cell.append(data)

    def section_text(self, sid: str) -> str:
        return " ".join(" ".join(self.text.get(sid, [])).split())

    def table(self, sid: str, first_row: str) -> Table:
        """The table of section ``sid`` that has a row headed ``first_row``."""
        found = [t for t in self.tables if t.section == sid and any(r and r[0] == first_row for r in t.rows)]
        assert len(found) == 1, (sid, first_row, [t.rows for t in self.tables if t.section == sid])
        return found[0]


def parse(html: str) -> Collector:
    c = Collector()
    c.feed(html)
    c.close()
    assert c.errors == []
    assert c.stack == [], f"unclosed: {c.stack}"
    return c


def _run(label: str, losses: list[float], samples_per_s: float, pull: int) -> dict:
    return {
        "label": label, "preset": label, "losses": losses,
        "auc": 0.73124, "logloss": 0.47018,
        "samples_per_s": samples_per_s, "step_ms_p50": 10.2, "step_ms_p99": 20.1,
        "stage_ms": {"read": 1.0, "featurize": 0.2, "prep": 0.5, "plan": 0.3, "fill": 0.4,
                     "gather": 2.0, "forward": 3.0, "backward": 2.5, "optim": 1.0, "writeback": 0.6},
        "bytes_per_step": {"worker_ps": 0, "trainer_ps.pull": pull, "trainer_ps.push": 120000,
                           "worker_trainer": 50000, "host_device": 1000, "device_host": 900},
        "wasted_bytes_per_step.worker_ps": 2048, "stale_drops": 1234, "fallbacks": 0,
        "hit_rate": {"device": 0.8, "host": 0.1},
        "miss_sources": {"host": 0.3, "delivered": 0.5, "trainer_ps": 0.2, "fresh": 0.0},
        "hbm_share": 0.95,
        "host": {"cpu_util": 1.6, "cpu_count": 2, "rss_bytes": 123456789, "mem_total_bytes": 25769803776},
    }


LOSSES = [0.69 - 0.001 * i for i in range(200)]


def _compare(identical: bool = True) -> dict:
    losses_b = LOSSES if identical else [x + (0.0123 if i == 7 else 0.0) for i, x in enumerate(LOSSES)]
    return {
        "config": "configs/criteo_dlrm.yaml", "steps": 200, "link_mbps": 200.0, "link_latency_ms": 0.0,
        "created": "2026-12-02T18:00:00Z",
        "loss_identical": identical, "loss_max_abs_diff": 0.0 if identical else 0.0123,
        "runs": {"a": _run("arch-a", LOSSES, 12345.0, 123456),
                 "b": _run("arch-b", losses_b, 13579.5, 262144)},
    }


def _missing() -> dict:
    """Run b measured almost nothing; the link is unshaped; no loss verdict."""
    c = _compare()
    del c["loss_identical"], c["loss_max_abs_diff"]
    c["link_mbps"] = None
    b = c["runs"]["b"]
    for key in ("losses", "auc", "hbm_share", "host", "bytes_per_step", "stale_drops"):
        del b[key]
    b["samples_per_s"] = None
    b["stage_ms"] = {"read": None, "forward": 4.0}
    return c


@pytest.fixture(scope="module")
def same() -> Collector:
    return parse(render_report(_compare(identical=True)))


def test_document_is_well_formed_with_every_section(same: Collector) -> None:
    assert same.section_ids == list(SECTION_IDS)
    assert set(SECTION_IDS) == {"loss", "auc", "throughput", "stages", "bytes", "hit_rate", "hbm", "host"}
    assert same.tags[None]["html"] == 1 and same.tags[None]["style"] == 1


def test_loss_section_has_one_svg_with_two_polylines(same: Collector) -> None:
    assert same.tags["loss"]["svg"] == 1
    assert same.tags["loss"]["polyline"] == 2
    assert len(same.polyline_points[0].split()) == 200


def test_every_table_has_a_column_per_run_label(same: Collector) -> None:
    for sid in SECTION_IDS:
        tables = [t for t in same.tables if t.section == sid]
        assert tables, sid
        for t in tables:
            assert "arch-a" in t.head and "arch-b" in t.head, (sid, t.head)
            assert all(len(r) == len(t.head) for r in t.rows), (sid, t.rows)


def test_identical_sentence(same: Collector) -> None:
    text = same.section_text("loss")
    assert "Loss curves are bit-identical" in text
    assert "differ" not in text


def test_differ_sentence() -> None:
    text = parse(render_report(_compare(identical=False))).section_text("loss")
    assert "Loss curves differ (max |diff| = 0.0123)" in text
    assert "bit-identical" not in text


def test_numbers_are_formatted(same: Collector) -> None:
    assert same.table("auc", "AUC").cell("AUC", "arch-a") == "0.7312"
    assert same.table("auc", "AUC").cell("logloss", "arch-b") == "0.4702"
    tp = same.table("throughput", "samples/s")
    assert tp.head == ["", "arch-a", "arch-b", "ratio b/a"]
    assert tp.cell("samples/s", "arch-a") == "12,345"
    assert tp.cell("samples/s", "arch-b") == "13,580"
    assert tp.cell("samples/s", "ratio b/a") == "1.100"
    assert tp.cell("step time p99 (ms)", "ratio b/a") == "1.000"
    assert same.table("stages", "forward (ms)").cell("forward (ms)", "arch-b") == "3.00"
    by = same.table("bytes", "trainer ← PS (pull)")
    assert by.cell("trainer ← PS (pull)", "arch-a") == "120.6 KiB"
    assert by.cell("trainer ← PS (pull)", "arch-b") == "256.0 KiB"
    assert by.cell("worker ↔ PS", "arch-a") == "0 B"
    assert by.cell("wasted worker ↔ PS", "arch-a") == "2.0 KiB"
    assert by.cell("stale drops", "arch-b") == "1,234"
    assert by.cell("total", "arch-a") == f"{(123456 + 120000 + 50000 + 1000 + 900) / 1024:,.1f} KiB"
    assert same.table("hit_rate", "device hit rate").cell("device hit rate", "arch-a") == "80.0%"
    assert same.table("hit_rate", "from delivered").cell("from delivered", "arch-b") == "50.0%"
    assert same.table("hbm", "HBM share").cell("HBM share", "arch-a") == "95.0%"
    host = same.table("host", "CPU share of cores")
    assert host.cell("CPU share of cores", "arch-a") == "80.0%"
    assert host.cell("resident memory (RSS)", "arch-b") == "117.7 MiB"
    assert host.cell("memory total", "arch-a") == "24.0 GiB"
    assert host.cell("RSS share of total", "arch-a") == "0.5%"


def test_header_shows_run_settings(same: Collector) -> None:
    text = same.section_text(None)
    expected = ("configs/criteo_dlrm.yaml", "200.0 Mbit/s", "0.00 ms", "2026-12-02T18:00:00Z",
                "arch-a vs arch-b")
    for s in expected:
        assert s in text, s


def test_no_external_references(same: Collector) -> None:
    assert same.refs and all(r.startswith("#") for r in same.refs), same.refs
    assert sorted(r[1:] for r in same.refs) == sorted(SECTION_IDS)
    assert not any(same.tags[s][t] for s in same.tags for t in ("script", "link", "img", "iframe"))


def test_missing_fields_render_na() -> None:
    c = parse(render_report(_missing()))
    assert c.section_ids == list(SECTION_IDS)
    assert c.tags["loss"]["polyline"] == 1
    assert "Loss comparison: n/a" in c.section_text("loss")
    assert c.table("auc", "AUC").cell("AUC", "arch-b") == "n/a"
    tp = c.table("throughput", "samples/s")
    assert (tp.cell("samples/s", "arch-b"), tp.cell("samples/s", "ratio b/a")) == ("n/a", "n/a")
    assert c.table("stages", "read (ms)").cell("read (ms)", "arch-b") == "n/a"
    assert c.table("stages", "read (ms)").cell("forward (ms)", "arch-b") == "4.00"
    by = c.table("bytes", "total")
    assert (by.cell("total", "arch-b"), by.cell("stale drops", "arch-b")) == ("n/a", "n/a")
    assert c.table("hbm", "HBM share").cell("HBM share", "arch-b") == "n/a"
    assert c.table("host", "RSS share of total").cell("RSS share of total", "arch-b") == "n/a"
    assert "link bandwidth n/a" in c.section_text(None)


def test_verdict_derived_from_losses_when_the_flag_is_missing() -> None:
    c = _compare(identical=False)
    del c["loss_identical"], c["loss_max_abs_diff"]
    assert "Loss curves differ (max |diff| = 0.0123)" in parse(render_report(c)).section_text("loss")
    c["runs"]["b"]["losses"] = list(LOSSES)
    assert "Loss curves are bit-identical" in parse(render_report(c)).section_text("loss")


def test_repeated_labels_are_disambiguated_and_text_escaped() -> None:
    c = _compare()
    c["runs"]["b"]["label"] = "arch-a"
    c["config"] = "<script>alert(1)</script>.yaml"
    html = render_report(c)
    parsed = parse(html)
    assert parsed.table("auc", "AUC").head == ["", "arch-a (a)", "arch-a (b)"]
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_empty_compare_still_renders() -> None:
    c = parse(render_report({}))
    assert c.section_ids == list(SECTION_IDS)
    assert c.tags["loss"]["polyline"] == 0


def test_write_report(tmp_path) -> None:
    path = write_report(_compare(), tmp_path / "out" / "report.html")
    assert path == tmp_path / "out" / "report.html"
    text = path.read_bytes().decode("utf-8")
    assert text == render_report(_compare()) and "worker ↔ PS" in text


def _numbers_in(svg: str) -> list[float]:
    points = parse(svg).polyline_points
    return [float(v) for p in points for xy in p.split() for v in xy.split(",")]


def test_line_chart_downsamples_and_survives_degenerate_series() -> None:
    long = [math.sin(i / 50) for i in range(5000)]
    svg = line_chart({"long": long, "flat": [2.0] * 10, "empty": [], "gaps": [None, float("nan"), 1.0]},
                     "t <1>", "step", "loss")
    c = parse(svg)
    assert c.tags[None]["svg"] == 1 and c.tags[None]["polyline"] == 3
    assert len(c.polyline_points[0].split()) == 1000
    assert all(math.isfinite(v) for v in _numbers_in(svg))
    assert "t &lt;1&gt;" in svg and "nan" not in svg.lower()
    assert "no data" in line_chart({"a": [], "b": []}, "t", "x", "y")
    assert len(_numbers_in(line_chart({"one": [5.0]}, "t", "x", "y"))) == 2


def test_bar_chart_labels_values_and_missing_bars() -> None:
    svg = bar_chart({"read": {"a": 1.5, "b": None}, "forward": {"a": 3.0, "b": 0.0}}, "stages", "ms",
                    value_format=lambda v: f"{v:.2f}")
    c = parse(svg)
    assert c.tags[None]["rect"] == 1 + 2 + 3  # background, legend, bars (the missing one is "n/a")
    text = " ".join(c.text[None])
    for s in ("1.50", "3.00", "0.00", "n/a", "read", "forward", "ms"):
        assert s in text, s
    assert "no data" in bar_chart({"x": {"a": None}}, "t", "u")


def test_render_is_fast_for_long_runs() -> None:
    c = copy.deepcopy(_compare())
    for run in c["runs"].values():
        run["losses"] = [0.7 - 1e-6 * i for i in range(200_000)]
    parsed = parse(render_report(c))
    assert all(len(p.split()) <= 1000 for p in parsed.polyline_points)
