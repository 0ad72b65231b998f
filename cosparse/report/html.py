"""Render a ``compare.json`` dict (runs "a" and "b" of ``cosparse compare``) as one self-contained HTML page.

No external assets: inline CSS and inline SVG charts (``cosparse.report.svg``). Every table has one column
per run, headed by the run's label; a missing or null number is shown as "n/a".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from cosparse.report import svg

NA = "n/a"
SECTION_IDS = ("loss", "auc", "throughput", "stages", "bytes", "hit_rate", "hbm", "host")
STAGES = ("read", "featurize", "prep", "plan", "fill", "gather", "forward", "backward", "optim",
          "writeback")
LINKS = {
    "worker_ps": "worker ↔ PS",
    "trainer_ps.pull": "trainer ← PS (pull)",
    "trainer_ps.push": "trainer → PS (push)",
    "worker_trainer": "worker → trainer",
    "host_device": "host → device",
    "device_host": "device → host",
}
TIERS = ("device", "host")
MISS_SOURCES = ("host", "delivered", "trainer_ps", "fresh")

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;padding:1rem 1.5rem;
max-width:1500px;color:#222;background:#fafafa}
h1{font-size:1.4rem;margin:.2rem 0 .6rem}h2{font-size:1.1rem;margin:.2rem 0 .6rem}
nav a{margin-right:.8rem;color:#1f5fa8}
.meta th{text-align:left;padding-right:1rem}
main{display:grid;grid-template-columns:repeat(auto-fit,minmax(680px,1fr));gap:1rem;margin-top:1rem}
section{background:#fff;border:1px solid #ddd;border-radius:6px;padding:.8rem 1rem;overflow-x:auto}
table{border-collapse:collapse;margin:.5rem 0;font-variant-numeric:tabular-nums}
th,td{border:1px solid #ddd;padding:.25rem .6rem}thead th{background:#f0f0f0}
td{text-align:right}tbody th{text-align:left;font-weight:normal}
.verdict{font-weight:bold}.same{color:#1a7f37}.differ{color:#b42318}.note{color:#666;font-size:.9rem}
"""


# ---- numbers -------------------------------------------------------------------------------------

def fmt_float(v: object, digits: int = 4) -> str:
    """Fixed-point with ``digits`` decimals and thousands separators, or "n/a"."""
    f = svg.finite(v)
    return NA if f is None else f"{f:,.{digits}f}"


def fmt_bytes(v: object) -> str:
    """Bytes in B, KiB, MiB, GiB or TiB (binary units), or "n/a"."""
    f = svg.finite(v)
    if f is None:
        return NA
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(f) >= scale:
            return f"{f / scale:,.1f} {unit}"
    return f"{f:,.0f} B"


def fmt_rate(v: object) -> str:
    """A rate with thousands separators: 12,345 (1 decimal below 100), or "n/a"."""
    f = svg.finite(v)
    if f is None:
        return NA
    return f"{f:,.0f}" if abs(f) >= 100 else f"{f:,.1f}"


def fmt_count(v: object) -> str:
    """A whole count with thousands separators, or "n/a"."""
    f = svg.finite(v)
    return NA if f is None else f"{round(f):,}"


def fmt_ms(v: object) -> str:
    """Milliseconds to 2 decimals, or "n/a"."""
    return fmt_float(v, 2)


def fmt_ratio(v: object) -> str:
    """A ratio to 3 decimals, or "n/a"."""
    return fmt_float(v, 3)


def fmt_share(v: object) -> str:
    """A fraction in [0, 1] as a percentage with one decimal, or "n/a"."""
    f = svg.finite(v)
    return NA if f is None else f"{f * 100:.1f}%"


def ratio(b: object, a: object) -> float | None:
    """b / a, or None when either is missing or a is zero."""
    fa, fb = svg.finite(a), svg.finite(b)
    return None if fa is None or fb is None or fa == 0 else fb / fa


# ---- runs ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Run:
    """One run of the comparison: its key in ``runs`` ("a", "b"), its column label and its data."""

    key: str
    label: str
    data: Mapping[str, Any]

    def get(self, *path: str) -> Any:
        """The value at ``path`` in the run's data, or None where any step is missing."""
        node: Any = self.data
        for name in path:
            if not isinstance(node, Mapping):
                return None
            node = node.get(name)
        return node


def runs_of(compare: Mapping[str, Any]) -> list[Run]:
    """The runs, "a" and "b" first, each with a unique label (a repeated label gets its key appended)."""
    raw = compare.get("runs")
    raw = raw if isinstance(raw, Mapping) else {}
    keys = sorted(raw, key=lambda k: (k not in ("a", "b"), str(k)))
    labels = [str(_mapping(raw[k]).get("label") or _mapping(raw[k]).get("preset") or k) for k in keys]
    return [Run(str(k), f"{lab} ({k})" if labels.count(lab) > 1 else lab, _mapping(raw[k]))
            for k, lab in zip(keys, labels, strict=True)]


def _mapping(v: object) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def _pair(runs: Sequence[Run]) -> tuple[Run, Run] | None:
    """Runs "a" and "b" when both are present (for b/a ratios)."""
    by_key = {r.key: r for r in runs}
    return (by_key["a"], by_key["b"]) if "a" in by_key and "b" in by_key else None


def _keys(runs: Sequence[Run], field: str, known: Sequence[str]) -> list[str]:
    """The known sub-keys of a dict field first, then any others the runs report, sorted."""
    seen = {k for r in runs for k in _mapping(r.get(field))}
    return list(known) + sorted(seen - set(known))


# ---- html pieces ---------------------------------------------------------------------------------

Row = tuple[str, Sequence[str]]


def table(head: Sequence[str], rows: Sequence[Row], caption: str = "") -> str:
    """A ``<table>`` with column headers ``head`` (the first over the row names); a ``<th>`` opens a row."""
    cap = f"<caption>{escape(caption)}</caption>" if caption else ""
    thead = "".join(f'<th scope="col">{escape(h)}</th>' for h in head)
    body = "".join(f'<tr><th scope="row">{escape(name)}</th>{_cells(cells)}</tr>' for name, cells in rows)
    return f"<table>{cap}<thead><tr>{thead}</tr></thead><tbody>{body}</tbody></table>"


def _cells(cells: Sequence[str]) -> str:
    return "".join(f"<td>{escape(c)}</td>" for c in cells)


def run_table(runs: Sequence[Run], rows: Sequence[tuple[str, Callable[[Run], str]]], first: str = "") -> str:
    """A table with one column per run (headed by its label), one row per (name, cell of a run)."""
    return table([first] + [r.label for r in runs], [(name, [cell(r) for r in runs]) for name, cell in rows])


def section(sid: str, title: str, body: str) -> str:
    """One ``<section id=sid>`` with its heading."""
    return f'<section id="{escape(sid)}"><h2>{escape(title)}</h2>{body}</section>'


def _p(text: str, cls: str = "note") -> str:
    return f'<p class="{cls}">{escape(text)}</p>'


# ---- sections ------------------------------------------------------------------------------------

def header(compare: Mapping[str, Any], runs: Sequence[Run]) -> str:
    """Title, run settings (config, steps, link, created) and the runs' presets."""
    c = compare.get
    mbps, lat = svg.finite(c("link_mbps")), svg.finite(c("link_latency_ms"))
    meta = [("config", str(c("config") or NA))]
    if c("config_b") not in (None, c("config")):
        meta.append(("config of b", str(c("config_b"))))
    meta += [("steps", fmt_count(c("steps"))),
            ("link bandwidth", NA if mbps is None else f"{mbps:,.1f} Mbit/s"),
            ("link latency", NA if lat is None else f"{lat:,.2f} ms"), ("created", str(c("created") or NA))]
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in meta)
    presets = run_table(runs, [("preset", lambda r: str(r.get("preset") or NA))], first="run")
    nav = "".join(f'<a href="#{s}">{s}</a>' for s in SECTION_IDS)
    title = " vs ".join(r.label for r in runs) or "no runs"
    return (f"<header><h1>cosparse compare: {escape(title)}</h1><table class=\"meta\">{rows}</table>"
            f"{presets}<nav>{nav}</nav></header>")


def _losses(run: Run) -> list[Any]:
    v = run.get("losses")
    return list(v) if isinstance(v, list | tuple) else []


def loss_verdict(compare: Mapping[str, Any], runs: Sequence[Run]) -> tuple[str, str]:
    """(sentence, css class): the compare's own verdict, else one derived from the two loss lists."""
    same, diff = compare.get("loss_identical"), svg.finite(compare.get("loss_max_abs_diff"))
    pair = _pair(runs)
    if not isinstance(same, bool) and pair and _losses(pair[0]) and _losses(pair[1]):
        la, lb = _losses(pair[0]), _losses(pair[1])
        same = la == lb
        diffs = [abs(x - y) for x, y in zip(la, lb, strict=False) if svg.finite(x) is not None
                 and svg.finite(y) is not None]
        diff = max(diffs, default=None) if diff is None else diff
    if same is True:
        return "Loss curves are bit-identical.", "same"
    if same is False:
        return f"Loss curves differ (max |diff| = {NA if diff is None else f'{diff:.3g}'}).", "differ"
    return f"Loss comparison: {NA} (the runs did not both record losses).", "note"


def loss_section(compare: Mapping[str, Any], runs: Sequence[Run]) -> str:
    """Both loss curves on one chart, the identical/differ sentence and the steps each run recorded."""
    chart = svg.line_chart({r.label: _losses(r) for r in runs}, "Training loss per step", "step", "loss")
    sentence, cls = loss_verdict(compare, runs)
    counts = run_table(runs, [("steps recorded", lambda r: fmt_count(len(_losses(r))) if _losses(r) else NA),
                              ("final loss", lambda r: fmt_float((_losses(r) or [None])[-1], 5))])
    return section("loss", "Loss", _p(sentence, f"verdict {cls}") + chart + counts)


def auc_section(runs: Sequence[Run]) -> str:
    """Evaluation quality: AUC and logloss."""
    rows = [("AUC", lambda r: fmt_float(r.get("auc"))), ("logloss", lambda r: fmt_float(r.get("logloss")))]
    return section("auc", "AUC and logloss", run_table(runs, rows))


def throughput_section(runs: Sequence[Run]) -> str:
    """Samples per second and step-time percentiles, with the b/a ratio."""
    metrics = [("samples/s", "samples_per_s", fmt_rate), ("step time p50 (ms)", "step_ms_p50", fmt_ms),
               ("step time p99 (ms)", "step_ms_p99", fmt_ms)]
    pair = _pair(runs)
    head = [""] + [r.label for r in runs] + (["ratio b/a"] if pair else [])
    rows = []
    for name, key, fmt in metrics:
        cells = [fmt(r.get(key)) for r in runs]
        if pair:
            cells.append(fmt_ratio(ratio(pair[1].get(key), pair[0].get(key))))
        rows.append((name, cells))
    note = _p("ratio b/a above 1: b has the higher rate, or the longer step time.") if pair else ""
    return section("throughput", "Throughput", table(head, rows) + note)


def _grouped(runs: Sequence[Run], field: str, keys: Sequence[str],
             names: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    return {names.get(k, k): {r.label: _mapping(r.get(field)).get(k) for r in runs} for k in keys}


def stages_section(runs: Sequence[Run]) -> str:
    """Mean milliseconds per step spent in each pipeline stage."""
    keys = _keys(runs, "stage_ms", STAGES)
    groups = _grouped(runs, "stage_ms", keys, {})
    chart = svg.bar_chart(groups, "Time per stage per step", "ms", width=_bar_width(groups, runs),
                          value_format=lambda v: f"{v:.2f}")
    rows = [(f"{k} (ms)", lambda r, k=k: fmt_ms(_mapping(r.get("stage_ms")).get(k))) for k in keys]
    return section("stages", "Pipeline stages", chart + run_table(runs, rows))


def _bar_width(groups: Mapping[str, Any], runs: Sequence[Run]) -> int:
    return max(640, 100 + 44 * len(groups) * max(len(runs), 1))


def _total_bytes(run: Run) -> float | None:
    vals = [svg.finite(v) for v in _mapping(run.get("bytes_per_step")).values()]
    vals = [v for v in vals if v is not None]
    return sum(vals) if vals else None


def byte_unit(groups: Mapping[str, Mapping[str, Any]]) -> tuple[str, int]:
    """The binary unit (name, bytes) that suits the largest value, so chart ticks come out round."""
    top = max((abs(f) for row in groups.values() for v in row.values() if (f := svg.finite(v)) is not None),
              default=0.0)
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if top >= scale:
            return unit, scale
    return "B", 1


def bytes_section(runs: Sequence[Run]) -> str:
    """Bytes per step on each link, plus wasted worker↔PS bytes, stale drops and fallbacks."""
    keys = _keys(runs, "bytes_per_step", tuple(LINKS))
    groups = _grouped(runs, "bytes_per_step", keys, LINKS)
    unit, scale = byte_unit(groups)
    scaled = {k: {n: (None if (f := svg.finite(v)) is None else f / scale) for n, v in row.items()}
              for k, row in groups.items()}
    chart = svg.bar_chart(scaled, "Bytes per step by link", f"{unit} / step", width=_bar_width(groups, runs),
                          value_format=lambda v: f"{v:,.1f}" if scale > 1 else f"{v:,.0f}")
    rows: list[tuple[str, Callable[[Run], str]]] = [
        (LINKS.get(k, k), lambda r, k=k: fmt_bytes(_mapping(r.get("bytes_per_step")).get(k))) for k in keys]
    rows += [("total", lambda r: fmt_bytes(_total_bytes(r))),
             ("wasted worker ↔ PS", lambda r: fmt_bytes(r.get("wasted_bytes_per_step.worker_ps"))),
             ("stale drops", lambda r: fmt_count(r.get("stale_drops"))),
             ("fallbacks", lambda r: fmt_count(r.get("fallbacks")))]
    return section("bytes", "Bytes per step", chart + run_table(runs, rows, first="per step"))


def hit_rate_section(runs: Sequence[Run]) -> str:
    """Hit rate per tier and where device misses were served from."""
    tiers = _keys(runs, "hit_rate", TIERS)
    sources = _keys(runs, "miss_sources", MISS_SOURCES)
    rows = [(f"{t} hit rate", lambda r, t=t: fmt_share(_mapping(r.get("hit_rate")).get(t))) for t in tiers]
    misses = [(f"from {s}", lambda r, s=s: fmt_share(_mapping(r.get("miss_sources")).get(s)))
              for s in sources]
    body = run_table(runs, rows, first="tier") + run_table(runs, misses, first="device misses served")
    return section("hit_rate", "Hit rates", body)


def hbm_section(runs: Sequence[Run]) -> str:
    """Share of the work kept in device memory (HBM)."""
    rows = [("HBM share", lambda r: fmt_share(r.get("hbm_share")))]
    return section("hbm", "HBM share", run_table(runs, rows))


def host_section(runs: Sequence[Run]) -> str:
    """Host CPU utilisation (busy cores and share of the cores) and resident memory."""
    def cpu_share(r: Run) -> str:
        return fmt_share(ratio(r.get("host", "cpu_util"), r.get("host", "cpu_count")))

    def mem_share(r: Run) -> str:
        return fmt_share(ratio(r.get("host", "rss_bytes"), r.get("host", "mem_total_bytes")))

    rows = [("CPU utilisation (busy cores)", lambda r: fmt_float(r.get("host", "cpu_util"), 2)),
            ("CPU cores", lambda r: fmt_count(r.get("host", "cpu_count"))),
            ("CPU share of cores", cpu_share),
            ("resident memory (RSS)", lambda r: fmt_bytes(r.get("host", "rss_bytes"))),
            ("memory total", lambda r: fmt_bytes(r.get("host", "mem_total_bytes"))),
            ("RSS share of total", mem_share)]
    return section("host", "Host CPU and memory", run_table(runs, rows))


def slow_steps_section(runs: Sequence[Run]) -> str:
    """``cosparse explain`` of each run: its slowest steps, the stage that grew, the cause."""
    body = ""
    for r in runs:
        ex = _mapping(r.get("slow_steps"))
        if not ex:
            continue
        rows = []
        for s in ex.get("slow", []):
            grown = ", ".join(f"{g[0]} {fmt_ms(g[1])} (median {fmt_ms(g[2])})"
                              for g in s.get("grown", [])[:2])
            causes = "; ".join(f"{c['kind']}: {c['text']}" for c in s.get("causes", [])[:2])
            rows.append((str(s["step"]), [fmt_ms(s["step_ms"]), grown or "-",
                                          causes or "none of the counters explains it"]))
        body += table(["step", "time", "stages that grew", "likely cause"], rows,
                      caption=f"{r.label}: median step {fmt_ms(ex.get('median_ms'))}, slow = "
                              f"{ex.get('rule', '')}")
    if not body:
        return ""
    return section("slow_steps", "Slow steps (cosparse explain)", body)


# ---- document ------------------------------------------------------------------------------------

def render_report(compare: Mapping[str, Any]) -> str:
    """The complete HTML5 document for a ``compare.json`` dict."""
    runs = runs_of(compare)
    title = "cosparse compare: " + (" vs ".join(r.label for r in runs) or "no runs")
    sections = [loss_section(compare, runs), auc_section(runs), throughput_section(runs),
                stages_section(runs), bytes_section(runs), hit_rate_section(runs), hbm_section(runs),
                host_section(runs), slow_steps_section(runs)]
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>"
            + header(compare, runs) + "<main>" + "".join(sections) + "</main></body></html>\n")


def write_report(compare: Mapping[str, Any], path: str | Path) -> Path:
    """Render ``compare`` and write it to ``path`` as UTF-8 (parent folders created); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_report(compare), encoding="utf-8")
    return out
