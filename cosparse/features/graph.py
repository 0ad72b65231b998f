"""The feature DAG: topological order (a cycle is a FeatureSpecError naming it), downstream sets and
content-hash versions (a feature's canonical spec plus its inputs' versions)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from cosparse.features.types import FeatureSpecError

VERSION_CHARS = 12


def topo_order(deps: Mapping[str, Sequence[str]]) -> list[str]:
    """Names of ``deps`` (name -> feature inputs) so that inputs come first; spec order otherwise.

    A cycle raises FeatureSpecError naming it, e.g. ``a -> b -> a``.
    """
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    order: list[str] = []
    for root in deps:
        if state.get(root) == 2:
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        path: list[str] = [root]
        state[root] = 1
        while stack:
            node, i = stack[-1]
            ins = [d for d in deps[node] if d in deps]
            if i < len(ins):
                stack[-1] = (node, i + 1)
                nxt = ins[i]
                s = state.get(nxt)
                if s == 1:
                    cyc = path[path.index(nxt):] + [nxt]
                    raise FeatureSpecError(f"feature '{nxt}': inputs form a cycle: {' -> '.join(cyc)}")
                if s is None:
                    state[nxt] = 1
                    stack.append((nxt, 0))
                    path.append(nxt)
            else:
                stack.pop()
                path.pop()
                state[node] = 2
                order.append(node)
    return order


def downstream(deps: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """name -> the features that use it directly (in spec order)."""
    out: dict[str, list[str]] = {n: [] for n in deps}
    for name, ins in deps.items():
        for d in ins:
            if d in out and name not in out[d]:
                out[d].append(name)
    return out


def closure(deps: Mapping[str, Sequence[str]], names: Sequence[str]) -> set[str]:
    """``names`` and every feature they depend on, transitively."""
    seen: set[str] = set()
    todo = [n for n in names if n in deps]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        todo.extend(d for d in deps[n] if d in deps)
    return seen


def digest(obj: Any) -> str:
    """``VERSION_CHARS`` hex chars of the sha256 of ``obj``'s canonical JSON."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:VERSION_CHARS]


def raw_version(name: str, kind: str | None) -> str:
    """Version of a raw column: its name and kind (``?`` when the spec does not declare it)."""
    return digest({"raw": name, "kind": kind or "?"})
