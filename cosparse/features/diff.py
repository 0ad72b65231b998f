"""Diff of two feature sets: added, removed and changed features (a changed spec, or a version
changed only because something upstream did), and the models each change affects."""

from __future__ import annotations

from typing import Any

from cosparse.features.feature_set import FeatureSet


def _what_changed(a: FeatureSet, b: FeatureSet, n: str) -> list[str]:
    fa, fb = a.features[n], b.features[n]
    keys = []
    if fa.kind != fb.kind:
        keys.append(f"kind {fa.kind} -> {fb.kind}")
    if fa.table != fb.table:
        keys.append(f"table {fa.table} -> {fb.table}")
    if fa.inputs != fb.inputs:
        keys.append(f"inputs {list(fa.inputs)} -> {list(fb.inputs)}")
    ta, tb = [t.canonical() for t in fa.transforms], [t.canonical() for t in fb.transforms]
    if ta != tb:
        for j in range(max(len(ta), len(tb))):
            x = ta[j] if j < len(ta) else None
            y = tb[j] if j < len(tb) else None
            if x != y:
                keys.append(f"transforms[{j}]: {_short(x)} -> {_short(y)}")
    return keys


def _short(t: Any) -> str:
    if t is None:
        return "(none)"
    text = f"{t[0]} {t[1]}"
    return text if len(text) <= 80 else text[:77] + "..."


def diff(a: FeatureSet, b: FeatureSet) -> dict[str, Any]:
    """{"added", "removed", "changed": [{name, old, new, cause, details}], "models": {...}}.

    ``cause`` is "spec" (its own definition changed) or "upstream" (only an input's version did;
    ``details`` names the changed inputs).
    """
    added = [n for n in b.order if n not in a.features]
    removed = [n for n in a.order if n not in b.features]
    changed = []
    for n in b.order:
        if n not in a.features or a.versions[n] == b.versions[n]:
            continue
        own = _what_changed(a, b, n)
        if own:
            changed.append({"name": n, "old": a.versions[n], "new": b.versions[n], "cause": "spec",
                            "details": own})
        else:
            ups = [i for i in b.features[n].inputs
                   if (a.versions.get(i) or a.raw_version(i)) != (b.versions.get(i) or b.raw_version(i))]
            changed.append({"name": n, "old": a.versions[n], "new": b.versions[n], "cause": "upstream",
                            "details": ups})
    touched = {c["name"] for c in changed} | set(removed)
    models: dict[str, Any] = {}
    for m in dict.fromkeys(list(a.consumers) + list(b.consumers)):
        ca, cb = a.consumers.get(m), b.consumers.get(m)
        names = [r.name for r in (cb or ca).consumes]  # type: ignore[union-attr]
        hit = [n for n in names if n in touched]
        stale = []
        if cb is not None:
            stale = [r for r in cb.consumes if r.version is not None and b.versions.get(r.name) != r.version]
        status = "added" if ca is None else "removed" if cb is None else \
            "changed" if [str(r) for r in ca.consumes] != [str(r) for r in cb.consumes] else "same"
        if hit or stale or status != "same":
            models[m] = {"status": status, "features": hit,
                         "stale_pins": [{"name": r.name, "pinned": r.version,
                                         "current": b.versions.get(r.name)} for r in stale]}
    return {"a": a.source_name, "b": b.source_name, "added": added, "removed": removed,
            "changed": changed, "models": models}


def format_diff(a: FeatureSet, b: FeatureSet) -> str:
    """The diff as text (what ``cosparse features diff`` prints)."""
    d = diff(a, b)
    lines = [f"diff {d['a']} -> {d['b']}:"]
    if not (d["added"] or d["removed"] or d["changed"] or d["models"]):
        return lines[0] + " no changes"
    for n in d["added"]:
        lines.append(f"  + {n}@{b.versions[n]}  (added)")
    for n in d["removed"]:
        lines.append(f"  - {n}@{a.versions[n]}  (removed)")
    for c in d["changed"]:
        if c["cause"] == "spec":
            lines.append(f"  ~ {c['name']}  {c['old']} -> {c['new']}  (changed: {'; '.join(c['details'])})")
        else:
            lines.append(f"  ~ {c['name']}  {c['old']} -> {c['new']}  (downstream of a change: "
                         f"input {', '.join(c['details'])} changed)")
    if d["models"]:
        lines.append("models affected:")
        for m, info in d["models"].items():
            parts = [f"model {info['status']}"] if info["status"] != "same" else []
            if info["features"]:
                parts.append(f"consumes changed/removed {', '.join(info['features'])}")
            for s in info["stale_pins"]:
                parts.append(f"pin {s['name']}@{s['pinned']} is stale (now {s['current']})")
            lines.append(f"  {m}: {'; '.join(parts)}")
    return "\n".join(lines)
