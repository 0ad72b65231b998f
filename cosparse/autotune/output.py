"""What ``cosparse tune`` writes: the best configuration as YAML, its diff against the start,
and an HTML report (the trial history, the knobs' importances, and the Pareto front of
samples/s against device memory)."""

from __future__ import annotations

import base64
import difflib
import html
import io
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import TrialState

from cosparse.autotune.knobs import apply, world
from cosparse.report.svg import line_chart


def write_outputs(study: optuna.Study, decision: dict[str, Any], out: Path) -> dict[str, Path]:
    start = study.user_attrs["start"]
    first = {k: v[0] for k, v in study.user_attrs["knobs"].items()}  # the start's values
    changed = {k: v for k, v in decision["params"].items() if v != first.get(k)}
    best = apply(start, {**changed, **(decision.get("semantic", {}).get("applied") or {})})
    a = yaml.safe_dump(start, sort_keys=False).splitlines(keepends=True)
    b = yaml.safe_dump(best, sort_keys=False).splitlines(keepends=True)
    ranks = world(decision["params"])
    if ranks > 1:  # the world size is how the run is launched, not a config key
        b.insert(0, f"# launch: torchrun --nproc-per-node {ranks} -m cosparse train --config "
                    "best.yaml\n")
    paths = {"best": out / "best.yaml", "diff": out / "diff.txt", "report": out / "report.html"}
    paths["best"].write_text("".join(b))
    paths["diff"].write_text("".join(difflib.unified_diff(a, b, "start.yaml", "best.yaml")))
    paths["report"].write_text(report_html(study, decision))
    return paths


def _rows(study: optuna.Study) -> list[dict[str, Any]]:
    out = []
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        fig = a.get("figures", {})
        why = a.get("veto") or a.get("error") or a.get("infeasible") or (
            "pruned" if t.state == TrialState.PRUNED else "")
        out.append({"trial": t.number, "role": a.get("role", ""), "params": t.params,
                    "samples_per_s": fig.get("samples_per_s"), "speedup": t.value,
                    "device_bytes": fig.get("device_bytes"), "feasible": not why and all(
                        v <= 0 for v in a.get("constraints", [1.0])), "note": why})
    return out


def pareto(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The feasible trials no other beats on both samples/s (higher) and device bytes
    (lower)."""
    ok = [r for r in rows if r["feasible"] and r["samples_per_s"]]
    return sorted((r for r in ok if not any(
        o["samples_per_s"] >= r["samples_per_s"] and o["device_bytes"] <= r["device_bytes"]
        and (o["samples_per_s"], o["device_bytes"]) != (r["samples_per_s"], r["device_bytes"])
        for o in ok)), key=lambda r: r["device_bytes"])


def _scatter(rows: list[dict[str, Any]], front: list[dict[str, Any]]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    ok = [r for r in rows if r["feasible"] and r["samples_per_s"]]
    ax.scatter([r["device_bytes"] / 2**20 for r in ok], [r["samples_per_s"] for r in ok],
               s=14, label="feasible trials")
    ax.plot([r["device_bytes"] / 2**20 for r in front], [r["samples_per_s"] for r in front],
            "o-", color="C3", label="Pareto front")
    ax.set_xlabel("device MiB")
    ax.set_ylabel("samples/s")
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _changes(suggestion: dict[str, Any], metric: str) -> str:
    """A suggestion's change in ``metric``: its one figure, or each task's (``engage +0.0010,
    buy -0.0030``)."""
    per = suggestion.get(f"{metric}_changes") or {}
    if len(per) <= 1:
        return f"{suggestion[f'{metric}_change']:+.4f}"
    return ", ".join(f"{html.escape(t)} {v:+.4f}" for t, v in per.items())


def _semantic_html(decision: dict[str, Any]) -> str:
    sem = decision.get("semantic")
    if not sem:
        return ""
    esc = html.escape
    rows = "".join(
        f"<tr><td>{esc(str(s['params']))}</td><td>{s['speedup']:.3f}</td>"
        f"<td>{_changes(s, 'auc')}</td><td>{_changes(s, 'logloss')}</td>"
        f"<td>{s['feasible']}</td><td>{s['passes_gate']}</td></tr>" for s in sem["suggested"])
    how = ("applied: " + esc(str(sem["applied"]))) if sem["applied"] else (
        "none applied" + ("" if sem.get("allowed") else " (semantic knobs are applied only with "
                                                          "--allow semantic)"))
    return f"""<h2>Semantic knobs: suggestions</h2><p>Measured from the decision, each with its
held-out AUC and log loss; AUC gate {sem.get('auc_gate', 0):g}; {how}.</p>
<table><tr><th>change</th><th>speedup</th><th>AUC change</th><th>log loss change</th>
<th>feasible</th><th>passes the gate</th></tr>{rows}</table>"""


def report_html(study: optuna.Study, decision: dict[str, Any]) -> str:
    rows = _rows(study)
    front = pareto(rows)
    try:
        importances = optuna.importance.get_param_importances(
            study, params=list(study.user_attrs["knobs"]))
    except (RuntimeError, ValueError) as e:  # too few completed trials, or no variation
        importances = {f"(not computed: {e})": 0.0}
    cand = [r for r in rows if r["role"] == "candidate" and r["speedup"] is not None]
    history = line_chart({"speedup over the start": [r["speedup"] for r in cand]},
                         "candidates, in trial order", "candidate", "speedup")
    esc = html.escape
    table = "".join(
        f"<tr><td>{r['trial']}</td><td>{r['role']}</td><td>{esc(str(r['params']))}</td>"
        f"<td>{(r['samples_per_s'] or 0):,.0f}</td><td>{(r['speedup'] or 0):.3f}</td>"
        f"<td>{(r['device_bytes'] or 0) / 2**20:,.1f}</td><td>{r['feasible']}</td>"
        f"<td>{esc(str(r['note']))}</td></tr>" for r in rows)
    imp = "".join(f"<tr><td>{esc(k)}</td><td>{v:.3f}</td></tr>" for k, v in importances.items())
    fr = "".join(f"<tr><td>{r['trial']}</td><td>{r['device_bytes'] / 2**20:,.1f}</td>"
                 f"<td>{r['samples_per_s']:,.0f}</td></tr>" for r in front)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>cosparse tune</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{border:1px solid #ccc;padding:2px 6px}}
table{{border-collapse:collapse;font-size:13px}}</style></head><body>
<h1>cosparse tune</h1>
<p>Decision: trial {decision['trial']} ({decision['role']}), {decision['speedup']:.3f}x the
start, params <code>{esc(str(decision['params']))}</code>.</p>
<h2>Trial history</h2>{history}
<table><tr><th>trial</th><th>role</th><th>params</th><th>samples/s</th><th>speedup</th>
<th>device MiB</th><th>feasible</th><th>note</th></tr>{table}</table>
{_semantic_html(decision)}
<h2>Knob importances</h2><table><tr><th>knob</th><th>importance</th></tr>{imp}</table>
<h2>Pareto front: samples/s against device memory</h2>
<img src="data:image/png;base64,{_scatter(rows, front)}" alt="Pareto front">
<table><tr><th>trial</th><th>device MiB</th><th>samples/s</th></tr>{fr}</table>
</body></html>
"""
