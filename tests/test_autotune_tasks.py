"""The tuner's AUC gate per task (issue 34 item 2): with several binary tasks a semantic setting
passes only if no task's AUC drops by more than the gate, and the report names each task's
change; a trial reports each task's held-out AUC; a one-label run's journal reads as before."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import optuna
import pytest

from cosparse.autotune.output import _semantic_html
from cosparse.autotune.semantic import _record, suggestions
from cosparse.autotune.types import Budgets, Knob, Measurement

ROOT = Path(__file__).resolve().parents[1]
KNOBS = [Knob("data.batch_size", (128, 256, 512), "semantic")]


def _study(runs: list[tuple[dict, Measurement]]) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    for params, m in runs:
        _record(study, "semantic" if params else "semantic-base", params, KNOBS, m, {})
    return study


def _m(speed: float, aucs: dict[str, float], loglosses: dict[str, float] | None = None
       ) -> Measurement:
    return Measurement(windows=[speed], aucs=aucs,
                       loglosses=loglosses or {t: 0.3 for t in aucs})


def test_a_setting_passes_only_if_no_tasks_auc_drops_past_the_gate():
    base = _m(100.0, {"engage": 0.70, "buy": 0.75})
    study = _study([({}, base),
                    ({"data.batch_size": 512}, _m(300.0, {"engage": 0.72, "buy": 0.73})),
                    ({"data.batch_size": 256}, _m(200.0, {"engage": 0.695, "buy": 0.76}))])
    out = suggestions(study, Budgets(), 1.05, True, auc_gate=0.01)
    fast, slower = out["suggested"]
    assert fast["params"] == {"data.batch_size": 512} and not fast["passes_gate"]
    assert fast["auc_changes"] == pytest.approx({"engage": 0.02, "buy": -0.02})
    assert fast["auc_change"] == pytest.approx(-0.02)  # the worst task's
    assert slower["passes_gate"] and out["applied"] == {"data.batch_size": 256}
    assert suggestions(study, Budgets(), 1.05, True, auc_gate=0.03)["applied"] == {
        "data.batch_size": 512}
    page = _semantic_html({"semantic": out})
    assert "engage +0.0200, buy -0.0200" in page and "engage -0.0050, buy +0.0100" in page
    from cosparse.autotune.semantic import _each  # (the log line's form)

    assert _each(fast["auc_changes"], "+.4f") == "engage +0.0200, buy -0.0200"


def test_an_undefined_task_auc_never_passes_the_gate():
    study = _study([({}, _m(100.0, {"engage": 0.70, "buy": 0.75})),
                    ({"data.batch_size": 256}, _m(200.0, {"engage": 0.71,
                                                          "buy": float("nan")}))])
    (s,) = suggestions(study, Budgets(), 1.05, True, auc_gate=1.0)["suggested"]
    assert not s["passes_gate"] and s["auc_change"] != s["auc_change"]


def test_a_one_label_journal_reads_as_before():
    """A journal from before tasks (``auc``/``logloss`` only) and one of a one-label run now
    (``aucs: {label: ...}``) give the same suggestion, its change that of ``auc``."""
    old = Measurement(windows=[100.0], auc=0.70, logloss=0.4)
    new = Measurement(windows=[150.0], auc=0.69, logloss=0.41)
    study = _study([({}, old), ({"data.batch_size": 256}, new)])
    (s,) = suggestions(study, Budgets(), 1.05, True, auc_gate=0.02)["suggested"]
    assert s["auc_change"] == pytest.approx(-0.01) and s["logloss_change"] == pytest.approx(0.01)
    assert s["passes_gate"] and list(s["auc_changes"]) == ["label"]
    assert "<td>-0.0100</td>" in _semantic_html({"semantic": {"suggested": [s],
                                                              "applied": None}})
    from cosparse.autotune.types import task_metric

    assert task_metric({"auc": 0.7, "logloss": 0.4}, "auc") == {"label": 0.7}
    assert task_metric({"auc.engage": 0.6, "auc.buy": 0.8, "gauc.buy": 0.5}, "auc") == {
        "engage": 0.6, "buy": 0.8}


def test_a_trial_reports_each_tasks_held_out_auc(tmp_path, capsys, monkeypatch):
    """``trial_run --evaluate`` of the two-task example (model.factory) on a log made here."""
    from cosparse.api.factory import MODEL_PATH_ENV
    from cosparse.autotune.trial_run import main
    from tests.test_task_labels import TASKS, _taobao_log

    monkeypatch.setenv(MODEL_PATH_ENV, str(ROOT / "examples"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    log = _taobao_log(tmp_path / "log.csv", users=40)
    raw = {"data": {"reader": "taobao_events", "path": str(log), "batch_size": 32,
                    "events": {"max_len": 4}, "columns": {"labels": TASKS}},
           "objective": {"tasks": {"engage": {}, "buy": {}}},
           "model": {"factory": "two_tasks:build", "args": {"hidden": [8]}},
           "tables": [{"name": "item", "dim": 4, "features": ["target_item", "hist_item"],
                       "pooling": "mean"},
                      {"name": "rest", "dim": 4, "pooling": "mean",
                       "features": ["user", "target_cate", "hist_cate", "hist_btag"]}],
           "train": {"steps": 3, "log_every": 1, "progress": False, "threads": 1}}
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(raw))
    assert main(str(cfg), evaluate=True) == 0
    done = [json.loads(line) for line in capsys.readouterr().out.splitlines()
            if line.startswith('{"done"')]
    (rec,) = done
    assert sorted(rec["aucs"]) == ["buy", "engage"] and sorted(rec["loglosses"]) == [
        "buy", "engage"]
    assert all(0.0 <= v <= 1.0 for v in rec["aucs"].values())
