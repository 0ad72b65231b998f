"""The offline agent: Optuna's TPE sampler over the start's exact knobs, each trial a short
real run of the engine, measured A/B/A against the start, pruned by Optuna's Wilcoxon pruner,
constrained by the budgets, vetoed when its results differ from the start's, and journaled.
A candidate the shared feasibility check refuses (``cosparse.autotune.feasible``: the config's
validation, device rows over host rows, tier bytes over a budget) is pruned before it runs,
with its reason journaled and logged.

Every trial's figures, digests, code version, config hash and who ran it go into the study's
``JournalStorage`` log; ``decide`` derives the decision from those records alone, so that
``cosparse tune --replay LOG`` reaches the one the search reached without running anything.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from cosparse.autotune.audit import code_version, config_hash
from cosparse.autotune.feasible import mapping_refusal
from cosparse.autotune.knobs import apply, reorders, semantic_knobs, world
from cosparse.autotune.measure import measure
from cosparse.autotune.semantic import semantic_pass, suggestions
from cosparse.autotune.tolerance import outside_tolerance
from cosparse.autotune.types import Budgets, Knob, Measurement, Window, median
from cosparse.config import ConfigError, config_from_mapping

STUDY = "cosparse-tune"
# the constraints: each budget's excess, then the exactness veto and a failed run (<= 0: met)
CONSTRAINTS = ("device_bytes", "host_bytes", "ps_bytes_per_step", "exactness", "ran")
APPLIED_BY = "cosparse tune (offline agent)"
NUMBERS = "numbers.npz"  # a trial's losses and whole rows, when reordering knobs are searched


def _open(path: Path) -> JournalStorage:
    return JournalStorage(JournalFileBackend(str(path)))


def _pruner() -> optuna.pruners.BasePruner:
    """Optuna's Wilcoxon pruner: a trial whose windows are significantly slower than the best
    trial's, window for window, stops early (the machine is noisy: a signed-rank test)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.pruners.WilcoxonPruner(p_threshold=0.1, n_startup_steps=2)


def _constrain(trial: optuna.trial.Trial, values: list[float]) -> None:
    """The constraint values (each <= 0: satisfied), for the sampler and for the journal."""
    for name, value in zip(CONSTRAINTS, values, strict=True):
        trial.set_constraint(name, value)
    trial.set_user_attr("constraints", values)


def tune(raw: dict[str, Any], knobs: list[Knob], budgets: Budgets, out: Path, trials: int,
         window: Window, minutes: float | None = None, trial_timeout_s: float = 300.0,
         log: Callable[[str], None] = print, seed: int = 0,
         semantic: list[Knob] | None = None, allow_semantic: bool = False,
         auc_gate: float = 0.0) -> dict[str, Any]:
    """Search ``trials`` candidates (or until ``minutes`` pass), then measure the ``semantic``
    knobs from the decision (suggestions; one applied only with ``allow_semantic`` and past
    the AUC gate); returns the decision."""
    out.mkdir(parents=True, exist_ok=True)
    journal = out / "journal.log"
    if journal.exists():
        journal.unlink()
    study = optuna.create_study(
        study_name=STUDY, storage=_open(journal), direction="maximize",
        sampler=optuna.samplers.TPESampler(seed=seed),
        pruner=_pruner())
    start = {k.key: k.choices[0] for k in knobs}
    dists = {k.key: CategoricalDistribution(list(k.choices)) for k in knobs}
    version = code_version()
    study.set_user_attr("start", raw)
    study.set_user_attr("budgets", budgets.to_dict())
    study.set_user_attr("knobs", {k.key: list(k.choices) for k in knobs})
    study.set_user_attr("code", version)
    deadline = None if minutes is None else time.monotonic() + 60 * minutes
    runs = out / "trials"
    keep_numbers = any(k.kind == "reordering" for k in knobs)  # compared within a tolerance

    def run(params: dict[str, Any], role: str) -> tuple[optuna.trial.Trial, Measurement | None]:
        """The trial measured (None: refused by the feasibility check, not run)."""
        if role == "baseline":  # the start, enqueued: measured again between candidates
            study.enqueue_trial(start, skip_if_exists=False)
        trial = study.ask(dists)
        params = {k: trial.params[k] for k in params}
        cfg = window.config(apply(raw, params))
        refusal = mapping_refusal(cfg, budgets) if role == "candidate" else None
        if refusal is not None:
            for key, value in {"role": role, "infeasible": refusal, "config_hash": config_hash(cfg),
                               **version, "applied_by": APPLIED_BY}.items():
                trial.set_user_attr(key, value)
            return trial, None

        def report(step: int, value: float) -> bool:
            trial.report(value, step)
            return role == "candidate" and trial.should_prune()

        where = runs / f"{trial.number:03d}"
        m = measure(cfg, window.warmup_steps, where, trial_timeout_s, report,
                    world=world(params), numbers=where / NUMBERS if keep_numbers else None,
                    window_steps=window.window_steps)
        for key, value in {"role": role, "windows": m.windows, "spans": m.spans,
                           "figures": m.figures(),
                           "loss_digest": m.loss_digest, "row_digest": m.row_digest,
                           "error": m.error, "config_hash": config_hash(cfg), **version,
                           "applied_by": APPLIED_BY}.items():
            trial.set_user_attr(key, value)
        return trial, m

    first, base = run(start, "baseline")
    assert base is not None  # (the start is measured, whatever it is)
    if base.error:
        _constrain(first, [1.0] * 5)
        study.tell(first, 0.0)
        raise ConfigError(f"the start configuration does not run: {base.error}")
    reference = (base.loss_digest, base.row_digest)
    _constrain(first, [*budgets.violations(base.figures()), -1.0, -1.0])
    first.set_user_attr("baselines", [base.samples_per_s, base.samples_per_s])
    study.tell(first, 1.0)
    log(f"start: {base.samples_per_s:,.0f} samples/s")
    before = base.samples_per_s
    refused = 0
    for _ in range(trials):
        if deadline is not None and time.monotonic() > deadline:
            log("time is up")
            break
        trial, m = run({k.key: None for k in knobs}, "candidate")
        if m is None:  # never run: no budget figure, and "ran" is the constraint it fails
            _constrain(trial, [-1.0, -1.0, -1.0, -1.0, 1.0])
            study.tell(trial, state=TrialState.PRUNED)
            refused += 1
            log(f"trial {trial.number} {trial.params}: pruned before it ran, infeasible: "
                f"{trial.user_attrs['infeasible']}")
            continue
        if m.pruned:
            study.tell(trial, state=TrialState.PRUNED)
            log(f"trial {trial.number} {trial.params}: pruned")
            continue
        again, b = run(start, "baseline")  # A/B/A: the start measured again after it
        after = b.samples_per_s if not b.error else before
        drift = not b.error and (b.loss_digest, b.row_digest) != reference
        if drift:  # the same config trained other numbers: the engine is not deterministic
            again.set_user_attr("veto", "engine bug: the start trained other losses or rows "
                                        "when run again")
            log(f"VETO trial {again.number}: {again.user_attrs['veto']}")
        _constrain(again, [*budgets.violations(b.figures()), 1.0 if drift else -1.0,
                           1.0 if b.error else -1.0])
        again.set_user_attr("baselines", [after, after])
        study.tell(again, 1.0)
        trial.set_user_attr("baselines", [before, after])
        veto = _veto(trial, m, reference, runs / f"{first.number:03d}" / NUMBERS, runs)
        if veto:
            trial.set_user_attr("veto", veto)
            log(f"VETO trial {trial.number}: {veto}")
        _constrain(trial, [*budgets.violations(m.figures()), 1.0 if veto else -1.0,
                           1.0 if m.error else -1.0])
        value = _speedup(m.samples_per_s, before, after)
        study.tell(trial, value)
        over = [f"{n} over by {v:,.0f}" for n, v in zip(
            CONSTRAINTS, budgets.violations(m.figures()), strict=False) if v > 0]
        log(f"trial {trial.number} {trial.params}: {value:.3f}x the start"
            + (f" ({m.error})" if m.error else "")
            + (f" (infeasible: {', '.join(over)})" if over else ""))
        before = after
    if refused:
        log(f"{refused} candidate(s) infeasible: pruned before they ran")
    if semantic:
        study.set_user_attr("semantic", {"allow": allow_semantic, "auc_gate": auc_gate})
        decided = decide(study)["params"]
        # those the decided configuration takes (admission, for one, is not every path's)
        fits = {k.key for k in semantic_knobs(config_from_mapping(apply(raw, decided)))}
        semantic_pass(study, raw, decided, [k for k in semantic if k.key in fits],
                      window, runs, trial_timeout_s, log)
    decision = decide_all(study)
    study.set_user_attr("decision", decision)
    return decision


def _veto(trial: optuna.trial.Trial, m: Measurement, reference: tuple[str, str],
          start_numbers: Path, runs: Path) -> str | None:
    """Why a finished trial's numbers disqualify it (None: they do not): a reordering trial
    outside the parallelism tolerance of the start's, or an exact one not bit-identical."""
    if m.error:
        return None
    if reorders(trial.params):
        why = outside_tolerance(start_numbers, runs / f"{trial.number:03d}" / NUMBERS)
        return None if why is None else f"outside the reordering tolerance: {why} " \
                                        f"(params {trial.params})"
    if (m.loss_digest, m.row_digest) != reference:
        return f"engine bug: an exact knob changed the losses or rows (params {trial.params})"
    return None


def _speedup(sps: float, before: float, after: float) -> float:
    ref = (before + after) / 2
    return sps / ref if ref > 0 else 0.0


def noise(study: optuna.Study) -> float:
    """The start's run-to-run spread: the coefficient of variation of its runs' throughput."""
    runs = [median(t.user_attrs["windows"]) for t in study.get_trials(
        deepcopy=False, states=(TrialState.COMPLETE,))
        if t.user_attrs.get("role") == "baseline" and t.user_attrs.get("windows")]
    return statistics.stdev(runs) / statistics.mean(runs) if len(runs) > 1 else 0.0


def decide(study: optuna.Study) -> dict[str, Any]:
    """The decision, from the journal's records alone: the feasible trial (the start among
    them) with the highest speedup, each speedup recomputed from its windows and the start's
    measurements around it, and its feasibility from its figures and the budgets. A candidate
    must beat the start by more than twice the start's own run-to-run spread, or the start
    stays: the best of many noisy measurements is otherwise a winner by chance."""
    budgets = Budgets(**study.user_attrs["budgets"])
    margin = 1.0 + 2.0 * noise(study)
    best: dict[str, Any] | None = None
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        a = t.user_attrs
        if a.get("role") not in ("baseline", "candidate"):  # (the semantic pass's)
            continue
        if a.get("error") or a.get("veto") or not a.get("windows"):
            continue
        if any(v > 0 for v in budgets.violations(a["figures"])):
            continue
        value = 1.0 if a["role"] == "baseline" else _speedup(median(a["windows"]),
                                                              *a["baselines"])
        if a["role"] == "candidate" and value <= margin:
            continue
        if best is None or value > best["speedup"]:
            best = {"trial": t.number, "role": a["role"], "params": dict(t.params),
                    "speedup": value, "figures": a["figures"]}
    if best is None:
        raise RuntimeError("no trial was feasible, not even the start")
    best["noise_margin"] = margin
    return best


def decide_all(study: optuna.Study) -> dict[str, Any]:
    """``decide``'s decision, with the semantic pass's suggestions (and the one applied) when
    the study ran one."""
    decision = decide(study)
    settings = study.user_attrs.get("semantic")
    if settings is not None:
        decision["semantic"] = suggestions(study, Budgets(**study.user_attrs["budgets"]),
                                           decision["noise_margin"], settings["allow"],
                                           settings["auc_gate"])
    return decision


def replay(journal: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the decision re-derived from the journal at ``journal``, the one it recorded)."""
    study = optuna.load_study(study_name=STUDY, storage=_open(journal))
    return decide_all(study), study.user_attrs.get("decision")


def load(journal: Path) -> optuna.Study:
    return optuna.load_study(study_name=STUDY, storage=_open(journal))
