"""The offline tuning agent (``cosparse tune``) on a tiny synthetic workload: real trial
processes, the start measured A/B/A, budgets as constraints, exact knobs checked against the
start's digests (and a knob that is not exact vetoed), the journal's audit records, and a
replay that reaches the same decision."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml

from cosparse.autotune.agent import Window, decide, load, replay, tune
from cosparse.autotune.knobs import WORLD, apply, exact_knobs, semantic_knobs
from cosparse.autotune.measure import measure
from cosparse.autotune.output import write_outputs
from cosparse.autotune.semantic import suggestions
from cosparse.autotune.tolerance import outside_tolerance
from cosparse.autotune.trial_run import save_numbers
from cosparse.autotune.types import Budgets, Knob
from cosparse.cli import main as cli_main
from cosparse.config import config_from_mapping

POOR = {
    "data": {"reader": "synthetic", "batch_size": 128, "workers": 0,
             "synthetic": {"num_features": 4, "num_dense": 2, "vocab_size": 20000,
                           "alpha": 1.05, "seed": 3, "num_batches": 60, "eval_batches": 1}},
    "model": {"kind": "dlrm", "bottom": [8, 8], "top": [8, 1],
              "dense_optimizer": {"kind": "adagrad", "lr": 0.05}},
    "tables": [{"name": "cat", "dim": 8, "features": ["C1", "C2", "C3", "C4"],
                "optimizer": {"kind": "rowwise_adagrad", "lr": 0.05}}],
    "store": {"device": {"rows": 600, "policy": "lru"}},
    "supply": {"lookahead": 0},
    "train": {"steps": 100, "threads": 1},
}
# (a warm-up that is not a whole number of windows: the trial logs every step)
WINDOW = Window(warmup_steps=3, windows=3, window_steps=2)
# the start with a host tier of 3,000 rows: device rows 4,800 and 9,600 cannot be under it
TIERED = json.loads(json.dumps(POOR))
TIERED["store"]["host"] = {"rows": 3000, "policy": "lru", "spill": True}
SAID: list[str] = []


@pytest.fixture(scope="module")
def searched(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tune")
    knobs = [k for k in exact_knobs(config_from_mapping(TIERED))
             if k.key in ("supply.lookahead", "store.device.rows", "store.device.policy")]
    # device rows over 4,800 (8 x 600) are over this budget: 4,800 rows x 36 bytes
    # (seed 1 proposes 9,600 and 4,800 device rows, infeasible, then 1,200: one run)
    tune(TIERED, knobs, Budgets(device_bytes=4800 * 36), out, trials=3, window=WINDOW,
         log=lambda m: (print(m), SAID.append(m)), seed=1)
    return out


def test_every_trial_is_journaled_with_its_audit_record(searched):
    study = load(searched / "journal.log")
    trials = study.get_trials(deepcopy=False)
    roles = [t.user_attrs["role"] for t in trials]
    assert roles[0] == "baseline" and roles.count("candidate") >= 1
    for t in trials:
        a = t.user_attrs
        assert a["git_sha"] and len(a["source_hash"]) == 64 and len(a["config_hash"]) == 64
        assert a["applied_by"] and len(a["constraints"]) == 5
        if t.state == optuna.trial.TrialState.COMPLETE:
            assert len(a["windows"]) == WINDOW.windows and a["figures"]["samples_per_s"] > 0
            # each window the steps after the warm-up's 3, two at a time
            assert a["spans"] == [[4, 5], [6, 7], [8, 9]]
            # exact knobs: every run trained the start's losses and rows, bit for bit
            assert (a["loss_digest"], a["row_digest"]) == (
                trials[0].user_attrs["loss_digest"], trials[0].user_attrs["row_digest"])
            assert not a.get("veto")
        if t.user_attrs["role"] == "candidate" and t.state.name == "COMPLETE":
            assert len(a["baselines"]) == 2  # the start before and after it (A/B/A)
            over = a["figures"]["device_bytes"] > 4800 * 36
            assert (max(a["constraints"]) > 0) == over


def test_infeasible_trials_are_pruned_before_they_run(searched):
    """Device rows over the host tier's 3,000 rows (which start-up sizing refuses: a crash):
    each such trial is pruned with its reason, never run, and the output says so."""
    study = load(searched / "journal.log")
    refused = [t for t in study.get_trials(deepcopy=False)
               if t.params.get("store.device.rows", 0) > 3000]
    assert refused, "the sampler never proposed an infeasible size"
    for t in refused:
        assert t.state == optuna.trial.TrialState.PRUNED
        assert "over store.host.rows 3000" in t.user_attrs["infeasible"]
        assert not (searched / "trials" / f"{t.number:03d}").exists()  # never run
        assert any(s.startswith(f"trial {t.number} ") and "pruned before it ran, infeasible"
                   in s for s in SAID)
    assert f"{len(refused)} candidate(s) infeasible: pruned before they ran" in SAID


def test_the_decision_keeps_the_budget_and_replays(searched):
    again, recorded = replay(searched / "journal.log")
    assert again == recorded
    assert recorded["figures"]["device_bytes"] <= 4800 * 36
    assert cli_main(["tune", "--replay", str(searched / "journal.log")]) == 0


def test_outputs_are_a_valid_config_a_diff_and_a_report(searched):
    study = load(searched / "journal.log")
    paths = write_outputs(study, decide(study), searched)
    best = yaml.safe_load(paths["best"].read_text())
    config_from_mapping(best)
    assert paths["diff"].read_text() == "" or paths["diff"].read_text().startswith("---")
    page = paths["report"].read_text()
    for part in ("Trial history", "Knob importances", "Pareto front", "data:image/png"):
        assert part in page


def test_a_knob_that_changes_the_results_is_vetoed(tmp_path):
    """``train.seed`` changes the dense model's initial weights: declared exact, the trial's
    digests differ from the start's, and the agent vetoes it (an engine bug, logged)."""
    said: list[str] = []
    # (sampler seed 0 proposes seed 7 first: one candidate, measured A/B/A; that a candidate
    # with the start's digests is not vetoed, test_every_trial_is_journaled... checks)
    tune(POOR, [Knob("train.seed", (0, 7))], Budgets(), tmp_path, trials=1, window=WINDOW,
         log=said.append, seed=0)
    study = load(tmp_path / "journal.log")
    vetoed = [t for t in study.get_trials() if t.user_attrs.get("veto")]
    assert vetoed and all(t.params["train.seed"] == 7 for t in vetoed)
    assert any("VETO" in s for s in said)
    assert decide(study)["params"]["train.seed"] == 0


def test_a_start_that_does_not_run_is_a_config_error(tmp_path, capsys):
    bad = json.loads(json.dumps(POOR))
    bad["store"]["device"]["rows"] = 10  # below one batch's unique rows
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    assert cli_main(["tune", "--config", str(path), "--trials", "1", "--out",
                     str(tmp_path / "o")]) == 2
    assert "the start configuration does not run" in capsys.readouterr().err


def _over_ps(path: str) -> dict:
    raw = json.loads(json.dumps(POOR))
    raw["store"]["host"] = {"rows": 3000, "policy": "lru", "spill": True, "spill_to": "remote"}
    raw["store"]["remote"] = {"num_shards": 1}
    raw["supply"]["path"] = path
    return raw


def test_every_supply_path_choice_is_a_valid_config():
    """The supply-path knob brings the store each path needs (A: no host tier; resident: no PS
    beneath the host tier), and drops what a path would refuse."""
    start = _over_ps("collaborative")
    start["supply"]["publish_every"] = 2
    (path_knob,) = [k for k in exact_knobs(config_from_mapping(start)) if k.key == "supply.path"]
    assert path_knob.choices[0] == "collaborative" and len(set(path_knob.choices)) == 4
    for choice in path_knob.choices:
        cfg = config_from_mapping(apply(start, {"supply.path": choice}))
        assert cfg.supply.path == choice
        assert (cfg.store.host.rows is None) == (choice in ("resident", "ps-direct"))


def test_the_supply_paths_train_the_same_numbers(tmp_path):
    """Trials of the start's other supply paths (rows resident, A over the PS) end with the
    start's (B's) losses and rows bit for bit: the path is an exact knob."""
    start = _over_ps("collaborative")
    runs = {p: measure(WINDOW.config(apply(start, {"supply.path": p})), WINDOW.warmup_steps,
                       tmp_path / p, 120.0, window_steps=WINDOW.window_steps)
            for p in ("collaborative", "resident", "ps-direct")}
    for p, m in runs.items():
        assert m.error is None, (p, m.error)
        assert (m.loss_digest, m.row_digest) == (runs["collaborative"].loss_digest,
                                                 runs["collaborative"].row_digest), p
    # an unbounded host tier counts the vocabulary (20,000 rows x 36 bytes), not the rows seen
    assert runs["resident"].host_bytes == 20000 * 36
    assert runs["ps-direct"].host_bytes == 0 and runs["ps-direct"].device_bytes == 600 * 36


@pytest.fixture(scope="module")
def semantic_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("semantic")
    knobs = [k for k in exact_knobs(config_from_mapping(POOR)) if k.key == "supply.lookahead"]
    sem = [k for k in semantic_knobs(config_from_mapping(POOR))
           if k.key in ("data.batch_size", "tables.*.optimizer.lr")]
    tune(POOR, knobs, Budgets(), out, trials=1, window=WINDOW, log=print, seed=1, semantic=sem)
    return out


def test_semantic_knobs_are_suggestions_with_their_auc(semantic_run):
    """Measured from the decision with held-out AUC and log loss, journaled, suggested, and
    never applied without --allow semantic: best.yaml keeps the start's batch size and rates."""
    study = load(semantic_run / "journal.log")
    decision = study.user_attrs["decision"]
    sem = decision["semantic"]
    assert sem["applied"] is None and not sem["allowed"]
    assert {next(iter(s["params"])) for s in sem["suggested"]} == {
        "data.batch_size", "tables.*.optimizer.lr"}
    # batch 256 needs more rows than the 600-row device tier holds: a failed trial, journaled
    failed = [t for t in study.get_trials() if t.user_attrs.get("role") == "semantic"
              and t.user_attrs.get("error")]
    assert [t.params for t in failed] == [{"data.batch_size": 256}]
    assert len(sem["suggested"]) == 3
    for s in sem["suggested"]:
        assert s["auc_change"] != 0.0 and s["logloss_change"] != 0.0 and s["speedup"] > 0
    write_outputs(study, decision, semantic_run)
    best = yaml.safe_load((semantic_run / "best.yaml").read_text())
    assert best["data"]["batch_size"] == 128
    assert all(t["optimizer"]["lr"] == 0.05 for t in best["tables"])
    assert "Semantic knobs: suggestions" in (semantic_run / "report.html").read_text()
    again, recorded = replay(semantic_run / "journal.log")
    assert again == recorded


def test_allow_semantic_applies_only_past_the_auc_gate(semantic_run):
    """With --allow semantic, the fastest feasible suggestion faster than the noise applies,
    but only if its held-out AUC drops by no more than the gate."""
    study = load(semantic_run / "journal.log")
    margin = decide(study)["noise_margin"]
    budgets = Budgets()
    open_gate = suggestions(study, budgets, 1.0, True, auc_gate=1.0)
    fastest = open_gate["suggested"][0]
    assert open_gate["applied"] == (fastest["params"] if fastest["speedup"] > 1.0 else None)
    shut = suggestions(study, budgets, margin, True, auc_gate=-1.0)  # the AUC must rise by 1
    assert shut["applied"] is None and not any(s["passes_gate"] for s in shut["suggested"])
    gated = suggestions(study, budgets, 1.0, True, auc_gate=0.0)
    if gated["applied"] is not None:
        (s,) = [x for x in gated["suggested"] if x["params"] == gated["applied"]]
        assert s["auc_change"] >= 0.0


def test_the_reordering_tolerance(tmp_path):
    """Losses within 1e-6 and rows within 1e-4 of their largest pass; beyond, the trial is out,
    with what differs by how much."""
    rng = np.random.default_rng(0)
    losses, ids, rows = rng.random(8), np.arange(5), rng.random((5, 3)).astype(np.float32)
    save_numbers(tmp_path / "a.npz", losses, {"t": {"ids": ids, "rows": rows}})

    def out(dl: float, dr: float) -> str | None:
        save_numbers(tmp_path / "b.npz", losses + dl, {"t": {"ids": ids[::-1].copy(),
                                                             "rows": (rows + dr)[::-1].copy()}})
        return outside_tolerance(tmp_path / "a.npz", tmp_path / "b.npz")

    assert out(5e-7, 5e-6) is None  # (in another ID order: compared by ID)
    assert "losses differ by up to 1.00e-05" in out(1e-5, 0.0)
    assert "table 't': rows differ" in out(0.0, 1e-3)


def test_a_world_size_trial_runs_on_ranks_within_the_tolerance(tmp_path):
    """A reordering knob's trial is one torchrun of 2 ranks: rank 0 reports the run with the
    ranks' shards merged, and it is judged against the start within the tolerance, not by
    digest."""
    # (sampler seed 3 proposes 2 ranks first: one torchrun, between two runs of the start)
    tune(POOR, [Knob(WORLD, (1, 2), "reordering")], Budgets(), tmp_path, trials=1,
         window=WINDOW, log=print, seed=3)
    study = load(tmp_path / "journal.log")
    two = [t for t in study.get_trials() if t.params.get(WORLD) == 2]
    assert two, "the sampler never tried 2 ranks"
    for t in two:
        a = t.user_attrs
        assert a["error"] is None, a["error"]
        assert len(a["windows"]) == WINDOW.windows
        assert (tmp_path / "trials" / f"{t.number:03d}" / "numbers.npz").exists()
        assert a.get("veto") is None or "outside the reordering tolerance" in a["veto"]
        print(t.number, a.get("veto"), a["figures"])
