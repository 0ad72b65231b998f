"""Render a capacity plan: text tables (capacity rows x policies) and the ``plan.png`` curves."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from cosparse.tune.plan import overall
from cosparse.tune.types import SimResult, TablePlan


def _cap_label(capacity: float, rows: int) -> str:
    head = f"{capacity * 100:g}%" if capacity <= 1 else f"{int(capacity)}"
    return f"{head} ({rows:,} rows)"


def format_curves(title: str, capacities: Sequence[float], results: dict[str, list[SimResult]],
                  metric: str) -> str:
    """One table: a row per capacity, a column per policy, cells ``metric`` (``hit_rate``...)."""
    names = list(results)
    labels = [_cap_label(c, results[names[0]][i].capacity) for i, c in enumerate(capacities)]
    w0 = max(len("capacity"), *(len(x) for x in labels))
    widths = [max(10, len(n)) for n in names]
    lines = [title,
             "  ".join([f"{'capacity':<{w0}}", *(f"{n:>{w}}" for n, w in zip(names, widths, strict=True))])]
    for i, label in enumerate(labels):
        cells = []
        for n, w in zip(names, widths, strict=True):
            v = getattr(results[n][i], metric)
            cells.append(f"{'infeasible' if math.isnan(v) else f'{v:.4f}':>{w}}")
        lines.append("  ".join([f"{label:<{w0}}", *cells]))
    return "\n".join(lines)


def format_plan(plans: Sequence[TablePlan]) -> str:
    """Every table's hit-rate and fetch-rate tables, then the overall ones."""
    blocks = []
    for p in plans:
        shrinks = {n: sum(r.shrinks for r in rs) for n, rs in p.results.items() if any(
            r.shrinks for r in rs)}
        head = (f"== table {p.name}: {p.num_ids:,} distinct IDs, {p.lookups:,} lookups in "
                f"{p.num_batches} batches, largest batch {p.max_unique:,} unique rows "
                f"(min feasible capacity {p.max_unique / max(p.num_ids, 1):.2%}), compulsory miss "
                f"rate {p.num_ids / max(p.lookups, 1):.4f}")
        if shrinks:
            head += "\n   lookahead shrinks (all capacities): " + ", ".join(
                f"{n}={s}" for n, s in shrinks.items())
        blocks.append(head)
        blocks.append(format_curves("hit rate (resident at batch start; prefetched rows are hits)",
                                    p.capacities, p.results, "hit_rate"))
        blocks.append(format_curves("fetched rows per lookup (demand + prefetch)", p.capacities,
                                    p.results, "fetch_rate"))
    if len(plans) > 1:
        tot = overall(plans)
        blocks.append("== overall (each table at its own capacity)")
        blocks.append(format_curves("hit rate", plans[0].capacities, tot, "hit_rate"))
        blocks.append(format_curves("fetched rows per lookup", plans[0].capacities, tot, "fetch_rate"))
    return "\n\n".join(blocks)


_MARKERS = {"lru": "o", "lfu": "s", "hotness": "^", "popularity_oracle": "D", "belady": "*"}


def _style(name: str) -> dict[str, object]:
    prefetch = name.startswith("lookahead-") or "_prefetch_" in name
    base = "hotness" if name.startswith("lookahead-") else name.split("_prefetch_")[0]
    return {"linestyle": "--" if prefetch else "-", "marker": _MARKERS.get(base, "o"),
            "markersize": 7 if base == "belady" else 5, "linewidth": 1.6}


def plot_plan(plans: Sequence[TablePlan], path: str | Path) -> Path:
    """``path`` (PNG): hit rate and fetched rows per lookup vs capacity fraction, a line per
    policy; the overall curves first, then one row per table when there are several."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: list[tuple[str, dict[str, list[SimResult]], float, float]] = []
    ids = sum(p.num_ids for p in plans)
    if len(plans) > 1:
        panels.append(("all tables", overall(plans), ids, sum(p.max_unique for p in plans) / ids))
    for p in plans:
        panels.append((f"table {p.name}", p.results, p.num_ids, p.max_unique / max(p.num_ids, 1)))
    fig, axes = plt.subplots(len(panels), 2, figsize=(13, 4.4 * len(panels) + 0.8), squeeze=False)
    for row, (title, results, num_ids, min_frac) in zip(axes, panels, strict=True):
        xs_all: list[float] = []
        for name, curve in results.items():
            xs = [r.capacity / num_ids for r in curve]
            xs_all = xs
            row[0].plot(xs, [r.hit_rate for r in curve], label=name, **_style(name))
            row[1].plot(xs, [r.fetch_rate for r in curve], label=name, **_style(name))
        for ax, metric in zip(row, ("hit rate (prefetched rows count)", "fetched rows per lookup"),
                              strict=True):
            ax.set_xscale("log")
            lo, hi = min(xs_all + [min_frac]) / 1.25, max(xs_all + [min_frac]) * 1.25
            ax.set_xlim(lo, hi)
            ax.axvspan(lo, min_frac, color="grey", alpha=0.15, linewidth=0)
            ax.set_xticks(xs_all)
            ax.set_xticklabels([f"{x * 100:.3g}%" for x in xs_all])
            ax.minorticks_off()
            ax.set_xlabel("cache capacity (fraction of distinct IDs)")
            ax.set_ylabel(metric)
            ax.set_title(f"{title}: {metric}")
            ax.grid(True, alpha=0.3)
        row[0].set_ylim(0, 1.02)
        row[1].set_ylim(0, None)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 7), fontsize=9,
               frameon=False)
    fig.suptitle("cosparse plan: device-cache curves (grey: infeasible, below the largest batch; "
                 "dashed: prefetching)")
    fig.tight_layout(rect=(0, 0.06 / len(panels), 1, 1))
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
