"""Hand-written inline SVG charts for the compare report: a line chart and a grouped bar chart.

Standard library only. Every piece of text goes through ``html.escape``; missing or non-finite values
are skipped (line chart) or drawn as "n/a" (bar chart), and empty or constant data never divides by zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape

Formatter = Callable[[float], str]

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
MAX_POINTS = 1000
_CHAR_W = 6.2  # rough width of one 11px sans-serif character, for layout only
_LEFT, _RIGHT, _TOP, _BOTTOM = 70, 16, 40, 46


@dataclass(frozen=True)
class _Scale:
    """Maps data values in [d0, d1] onto pixels in [r0, r1] (d0 != d1 by construction)."""

    d0: float
    d1: float
    r0: float
    r1: float

    def __call__(self, v: float) -> float:
        return self.r0 + (v - self.d0) * (self.r1 - self.r0) / (self.d1 - self.d0)


def finite(v: object) -> float | None:
    """``v`` as a float when it is a finite real number (not a bool), else None."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def short_number(v: float) -> str:
    """Compact tick label: 1.5k, 12M, 0.25, 3e-07."""
    a = abs(v)
    for bound, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= bound:
            return f"{v / bound:.3g}{suffix}"
    return "0" if v == 0 else f"{v:.3g}"


def nice_ticks(lo: float, hi: float, count: int = 5,
               integer: bool = False) -> tuple[float, float, list[float]]:
    """A padded range [start, stop] covering [lo, hi] and evenly spaced round ticks across it."""
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(count - 1, 1)
    if not math.isfinite(raw) or raw <= 0:
        return lo, hi, [lo, hi]
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    if integer:
        step = max(1.0, round(step))
    start, stop = math.floor(lo / step) * step, math.ceil(hi / step) * step
    n = max(1, round((stop - start) / step))
    return start, stop, [round(start + i * step, 12) for i in range(n + 1)]


def downsample(values: Sequence[object], max_points: int = MAX_POINTS) -> list[tuple[int, float]]:
    """(index, value) pairs of the finite values, at most ``max_points`` evenly spaced ones (ends kept)."""
    n = len(values)
    if n > max_points > 1:
        idx: Iterable[int] = sorted({round(k * (n - 1) / (max_points - 1)) for k in range(max_points)})
    else:
        idx = range(n)
    out = []
    for i in idx:
        f = finite(values[i])
        if f is not None:
            out.append((i, f))
    return out


def _text(x: float, y: float, s: str, size: float = 11, anchor: str = "start", extra: str = "") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size:.1f}" text-anchor="{anchor}"{extra}>'
            f"{escape(s)}</text>")


def _open(width: int, height: int, title: str) -> str:
    t = escape(title)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{t}" font-family="sans-serif">'
            f"<title>{t}</title>"
            f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>'
            + _text(8, 18, title, size=13, extra=' font-weight="bold"'))


def _legend(names: Sequence[str], right: float, y: float) -> str:
    """Legend items laid out leftwards from ``right`` on one row."""
    parts, x = [], right
    for i in reversed(range(len(names))):
        x -= 22 + len(names[i]) * _CHAR_W
        color = PALETTE[i % len(PALETTE)]
        parts.append(f'<rect x="{x:.1f}" y="{y - 9:.1f}" width="14" height="10" fill="{color}"/>')
        parts.append(_text(x + 18, y, names[i]))
        x -= 10
    return '<g class="legend">' + "".join(parts) + "</g>"


def _y_axis(ticks: Sequence[float], sy: _Scale, left: float, right: float, fmt: Formatter) -> str:
    parts = []
    for t in ticks:
        y = sy(t)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        parts.append(_text(left - 6, y + 4, fmt(t), size=10, anchor="end"))
    return "".join(parts)


def _x_ticks(ticks: Sequence[float], sx: _Scale, bottom: float) -> str:
    parts = []
    for t in ticks:
        x = sx(t)
        parts.append(f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 4}" stroke="#333"/>')
        parts.append(_text(x, bottom + 16, short_number(t), size=10, anchor="middle"))
    return "".join(parts)


def _axes(left: float, top: float, right: float, bottom: float, x_label: str, y_label: str) -> str:
    mid_y = (top + bottom) / 2
    return (f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#333"/>'
            f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="#333"/>'
            + _text((left + right) / 2, bottom + 34, x_label, anchor="middle")
            + _text(14, mid_y, y_label, anchor="middle", extra=f' transform="rotate(-90 14 {mid_y:.1f})"'))


def _polyline(points: Sequence[tuple[int, float]], sx: _Scale, sy: _Scale, i: int, name: str) -> str:
    color = PALETTE[i % len(PALETTE)]
    dash = ' stroke-dasharray="6 4"' if i % 2 else ""  # a dashed second run keeps identical curves visible
    coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
    line = (f'<polyline fill="none" stroke="{color}" stroke-width="1.6"{dash} points="{coords}">'
            f"<title>{escape(name)}</title></polyline>")
    if len(points) == 1:  # a lone point draws nothing as a line
        line += f'<circle cx="{sx(points[0][0]):.1f}" cy="{sy(points[0][1]):.1f}" r="2.5" fill="{color}"/>'
    return line


def _no_data(width: int, height: int) -> str:
    return _text(width / 2, height / 2, "no data", size=12, anchor="middle", extra=' fill="#888"')


def line_chart(series: Mapping[str, Sequence[float]], title: str, x_label: str, y_label: str,
               width: int = 640, height: int = 320, y_format: Formatter | None = None) -> str:
    """An ``<svg>`` with one polyline per non-empty series (x = index), axes, ticks and a legend."""
    fmt = y_format or short_number
    left, right, top, bottom = _LEFT, width - _RIGHT, _TOP, height - _BOTTOM
    points = {name: downsample(list(vals or ())) for name, vals in series.items()}
    parts = [_open(width, height, title), _legend(list(points), right, 18)]
    ys = [y for pts in points.values() for _, y in pts]
    if not ys:
        parts += [_axes(left, top, right, bottom, x_label, y_label), _no_data(width, height), "</svg>"]
        return "".join(parts)
    y0, y1, y_ticks = nice_ticks(min(ys), max(ys))
    x_hi = max(x for pts in points.values() for x, _ in pts)
    x0, x1, x_ticks = nice_ticks(0, max(x_hi, 1), integer=True)
    sx, sy = _Scale(x0, x1, left, right), _Scale(y0, y1, bottom, top)
    parts += [_y_axis(y_ticks, sy, left, right, fmt), _x_ticks(x_ticks, sx, bottom),
              _axes(left, top, right, bottom, x_label, y_label)]
    parts += [_polyline(pts, sx, sy, i, name) for i, (name, pts) in enumerate(points.items()) if pts]
    parts.append("</svg>")
    return "".join(parts)


def _run_names(groups: Mapping[str, Mapping[str, object]]) -> list[str]:
    names: dict[str, None] = {}
    for values in groups.values():
        names.update(dict.fromkeys(values))
    return list(names)


def _tilt_room(cats: Sequence[str], slot: float) -> float:
    """Extra bottom margin for tilted category names; 0 when the longest one fits its group's slot."""
    longest = max((len(c) for c in cats), default=0) * _CHAR_W
    return longest * 0.45 if longest > slot * 0.95 else 0.0


def _category_labels(cats: Sequence[str], sx_slot: float, left: float, bottom: float, tilt: bool) -> str:
    """Category names under each group, tilted when they do not fit their slot."""
    parts = []
    for j, cat in enumerate(cats):
        x, y = left + (j + 0.5) * sx_slot, bottom + 16
        rotate = f' transform="rotate(-25 {x:.1f} {y:.1f})"' if tilt else ""
        parts.append(_text(x, y, cat, size=10, anchor="end" if tilt else "middle", extra=rotate))
    return "".join(parts)


def _bar(x: float, w: float, v: float | None, sy: _Scale, i: int, name: str, fmt: Formatter) -> str:
    """One bar with its value label; a missing value is an "n/a" label on the baseline."""
    base = sy(0.0)
    if v is None:
        return _text(x + w / 2, base - 4, "n/a", size=8, anchor="middle", extra=' fill="#888"')
    y = sy(v)
    top, h = min(y, base), abs(base - y)
    label = fmt(v)
    size = max(6.5, min(10.0, w / (0.6 * max(len(label), 1))))
    label_y = top - 3 if v >= 0 else top + h + size + 1
    return (f'<rect x="{x:.1f}" y="{top:.1f}" width="{w:.1f}" height="{max(h, 0.5):.1f}" '
            f'fill="{PALETTE[i % len(PALETTE)]}"><title>{escape(f"{name}: {label}")}</title></rect>'
            + _text(x + w / 2, label_y, label, size=size, anchor="middle"))


def bar_chart(groups: Mapping[str, Mapping[str, float | None]], title: str, unit: str,
              width: int = 640, height: int = 320, value_format: Formatter | None = None) -> str:
    """Grouped bars: one group per category (x axis), one coloured bar per run, value labels on top."""
    fmt = value_format or short_number
    cats, names = list(groups), _run_names(groups)
    left, right, top = _LEFT, width - _RIGHT, _TOP
    slot = (right - left) / max(len(cats), 1)
    tilt_room = _tilt_room(cats, slot)
    bottom = height - _BOTTOM - tilt_room
    parts = [_open(width, height, title), _legend(names, right, 18)]
    values = {c: {n: finite(groups[c].get(n)) for n in names} for c in cats}
    vs = [v for row in values.values() for v in row.values() if v is not None]
    if not vs:
        parts += [_axes(left, top, right, bottom, "", unit), _no_data(width, height), "</svg>"]
        return "".join(parts)
    lo, hi = min(0.0, *vs), max(0.0, *vs)
    y0, y1, ticks = nice_ticks(lo, hi + (hi - lo) * 0.08)  # headroom for the value labels
    sy = _Scale(y0, y1, bottom, top)
    bar_w = slot * 0.8 / max(len(names), 1)
    parts += [_y_axis(ticks, sy, left, right, fmt), _axes(left, top, right, bottom, "", unit)]
    for j, cat in enumerate(cats):
        x0 = left + j * slot + slot * 0.1
        parts += [_bar(x0 + i * bar_w, bar_w * 0.92, values[cat][n], sy, i, n, fmt)
                  for i, n in enumerate(names)]
    parts += [_category_labels(cats, slot, left, bottom, tilt_room > 0), "</svg>"]
    return "".join(parts)
