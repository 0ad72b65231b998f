"""Lineage of a feature set: each feature with its version, kind, table, inputs and downstream
features, and which models consume which versions. ``lineage`` gives a structure, ``format_lineage``
the text that ``cosparse features lineage`` prints."""

from __future__ import annotations

from typing import Any

from cosparse.features.feature_set import FeatureSet


def lineage(fs: FeatureSet) -> dict[str, Any]:
    """{"features": [...], "models": [...]} in topological order (see the module docstring)."""
    users: dict[str, list[str]] = {n: [] for n in fs.features}
    models = []
    for c in fs.consumers.values():
        feats = []
        for r in c.consumes:
            cur = fs.versions.get(r.name)
            status = "unknown feature" if cur is None else \
                "ok" if r.version in (None, cur) else f"stale pin (current {cur})"
            feats.append({"name": r.name, "version": r.version or cur, "pinned": r.version is not None,
                          "status": status})
            if r.name in users:
                users[r.name].append(c.name)
        models.append({"name": c.name, "features": feats})
    feats = []
    for n in fs.order:
        f = fs.features[n]
        ins = [{"name": i, "version": fs.versions[i] if i in fs.features else fs.raw_version(i),
                "raw": i not in fs.features} for i in f.inputs]
        feats.append({"name": n, "version": fs.versions[n], "kind": f.kind, "table": f.table,
                      "transforms": [t.op for t in f.transforms], "inputs": ins,
                      "downstream": list(fs.downstream[n]), "consumers": users[n]})
    return {"spec": fs.source_name, "features": feats, "models": models}


def format_lineage(fs: FeatureSet) -> str:
    """The lineage as text: one block per feature, then one line per model."""
    lin = lineage(fs)
    lines = [f"features of {lin['spec']} ({len(lin['features'])}, inputs first):"]
    for f in lin["features"]:
        table = f" table={f['table']}" if f["table"] else ""
        lines.append(f"  {f['name']}@{f['version']}  {f['kind']}{table}  "
                     f"[{' -> '.join(f['transforms']) or 'identity'}]")
        ins = ", ".join(f"{i['name']} (raw)" if i["raw"] else f"{i['name']}@{i['version']}"
                        for i in f["inputs"])
        lines.append(f"      inputs: {ins}")
        if f["downstream"]:
            lines.append(f"      downstream: {', '.join(f['downstream'])}")
        if f["consumers"]:
            lines.append(f"      consumed by: {', '.join(f['consumers'])}")
    lines.append(f"models ({len(lin['models'])}):")
    for m in lin["models"]:
        parts = []
        for r in m["features"]:
            mark = " (pinned)" if r["pinned"] else ""
            mark += "" if r["status"] == "ok" else f" [{r['status']}]"
            parts.append(f"{r['name']}@{r['version']}{mark}")
        lines.append(f"  {m['name']}: {', '.join(parts)}")
    return "\n".join(lines)
