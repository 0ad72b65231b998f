"""Semantic knobs after the exact search: each value measured from the decided configuration,
with its throughput and its held-out AUC and log loss, journaled beside the exact trials.

They change what the model learns, so they are suggestions: ``decide_semantic`` applies one only
when allowed (``cosparse tune --allow semantic``), and then only the fastest that is feasible,
faster than the noise margin, and whose held-out AUC drops by no more than the gate: with several
binary tasks, no task's AUC may drop by more, and the report names each task's change.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from cosparse.autotune.audit import code_version, config_hash
from cosparse.autotune.feasible import mapping_refusal
from cosparse.autotune.knobs import apply, world
from cosparse.autotune.measure import measure
from cosparse.autotune.types import Budgets, Knob, Measurement, Window

ROLES = ("semantic-base", "semantic")


def _record(study: optuna.Study, role: str, params: dict[str, Any], knobs: list[Knob],
            m: Measurement, cfg: dict[str, Any]) -> None:
    dists = {k.key: CategoricalDistribution(list(k.choices)) for k in knobs if k.key in params}
    attrs = {"role": role, "windows": m.windows, "figures": m.figures(), "auc": m.auc,
             "logloss": m.logloss, "aucs": m.aucs, "loglosses": m.loglosses, "error": m.error,
             "config_hash": config_hash(cfg),
             **code_version(), "applied_by": "cosparse tune (offline agent, semantic pass)"}
    value = m.samples_per_s if not m.error else 0.0
    study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=value,
                                              user_attrs=attrs))


def _refused(study: optuna.Study, params: dict[str, Any], knobs: list[Knob], why: str,
             cfg: dict[str, Any]) -> None:
    dists = {k.key: CategoricalDistribution(list(k.choices)) for k in knobs if k.key in params}
    attrs = {"role": "semantic", "infeasible": why, "config_hash": config_hash(cfg),
             **code_version(), "applied_by": "cosparse tune (offline agent, semantic pass)"}
    study.add_trial(optuna.trial.create_trial(params=params, distributions=dists,
                                              state=TrialState.PRUNED, user_attrs=attrs))


def semantic_pass(study: optuna.Study, raw: dict[str, Any], decided: dict[str, Any],
                  knobs: list[Knob], window: Window, runs: Path, timeout_s: float,
                  log: Callable[[str], None] = print) -> None:
    """Measure every other value of every semantic knob from the decided exact params, and
    the decided configuration itself (the reference), each with its held-out evaluation; a
    value the feasibility check refuses is journaled as a pruned trial, not run."""
    base_cfg = window.config(apply(raw, decided))
    ranks = world(decided)
    budgets = Budgets(**study.user_attrs["budgets"])
    base = measure(base_cfg, window.warmup_steps, runs / "semantic-base", timeout_s,
                   evaluate=True, world=ranks, window_steps=window.window_steps)
    _record(study, "semantic-base", {}, knobs, base, base_cfg)
    if base.error:
        log(f"semantic pass: the decided configuration failed to run: {base.error}")
        return
    log(f"semantic pass: reference {base.samples_per_s:,.0f} samples/s, AUC "
        f"{_each(base.aucs, '.4f')}")
    for knob in knobs:
        for value in knob.choices[1:]:
            cfg = window.config(apply(raw, {**decided, knob.key: value}))
            why = mapping_refusal(cfg, budgets)
            if why is not None:
                _refused(study, {knob.key: value}, knobs, why, cfg)
                log(f"semantic {knob.key} = {value}: pruned before it ran, infeasible: {why}")
                continue
            m = measure(cfg, window.warmup_steps, runs / f"semantic-{knob.key}-{value}",
                        timeout_s, evaluate=True, world=ranks, window_steps=window.window_steps)
            _record(study, "semantic", {knob.key: value}, knobs, m, cfg)
            if m.error:
                log(f"semantic {knob.key} = {value}: failed ({m.error[:200]})")
            else:
                log(f"semantic {knob.key} = {value}: {m.samples_per_s / base.samples_per_s:.3f}x, "
                    f"AUC {_each(_changes(m.aucs, base.aucs), '+.4f')}, log loss "
                    f"{_each(_changes(m.loglosses, base.loglosses), '+.4f')}")


def _scores(attrs: dict[str, Any], metric: str) -> dict[str, float]:
    """A trial's held-out ``metric`` per task (a journal from before tasks: its one figure)."""
    one = attrs.get(metric)
    per = attrs.get({"auc": "aucs", "logloss": "loglosses"}[metric])
    return per or ({} if one is None else {"label": one})


def _changes(new: dict[str, float], ref: dict[str, float]) -> dict[str, float]:
    """Each task's change from the reference (NaN for a task either lacks)."""
    return {t: new.get(t, float("nan")) - ref.get(t, float("nan")) for t in ref}


def _worst(changes: dict[str, float], sign: float) -> float:
    """The worst task's change: the lowest (``sign`` -1: AUC) or highest (1: log loss); an
    undefined one (NaN) before any."""
    values = list(changes.values())
    if not values or any(v != v for v in values):
        return float("nan")
    return sign * max(sign * v for v in values)


def _each(values: dict[str, float], fmt: str) -> str:
    """``0.7012`` for the one task ``label``; ``engage 0.6845, buy 0.7008`` for several."""
    if list(values) == ["label"]:
        return format(values["label"], fmt)
    return ", ".join(f"{t} {format(v, fmt)}" for t, v in values.items())


def suggestions(study: optuna.Study, budgets: Budgets, margin: float, allow: bool,
                auc_gate: float) -> dict[str, Any]:
    """From the journal alone: each semantic value's speedup over the reference and change in
    AUC and log loss, per binary task (``auc_changes``; ``auc_change`` is the worst of them),
    and the one applied (None unless ``allow``, and one passes the gate: no task's AUC drops
    by more than ``auc_gate``; an undefined change never passes)."""
    trials = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
              if t.user_attrs.get("role") in ROLES]
    base = next((t.user_attrs for t in trials if t.user_attrs["role"] == "semantic-base"), None)
    if base is None or base.get("error"):
        return {"suggested": [], "applied": None}
    ref = base["figures"]["samples_per_s"]
    out = []
    for t in trials:
        a = t.user_attrs
        if a["role"] != "semantic" or a.get("error") or not _scores(a, "auc"):
            continue
        aucs = _changes(_scores(a, "auc"), _scores(base, "auc"))
        losses = _changes(_scores(a, "logloss"), _scores(base, "logloss"))
        s = {"params": dict(t.params), "speedup": a["figures"]["samples_per_s"] / ref,
             "auc_changes": aucs, "logloss_changes": losses,
             "auc_change": _worst(aucs, -1.0), "logloss_change": _worst(losses, 1.0),
             "feasible": all(v <= 0 for v in budgets.violations(a["figures"]))}
        s["passes_gate"] = bool(aucs) and all(v >= -auc_gate for v in aucs.values())
        out.append(s)
    out.sort(key=lambda s: -s["speedup"])
    ok = [s for s in out if s["feasible"] and s["passes_gate"] and s["speedup"] > margin]
    return {"suggested": out, "applied": ok[0]["params"] if allow and ok else None,
            "auc_gate": auc_gate, "allowed": allow}
