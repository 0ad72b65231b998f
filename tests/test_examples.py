"""The examples run as written and learn: ``examples/own_model.py`` (README's "Your own model")
on Criteo's first 10,000 lines under a bounded device tier, and ``examples/two_tasks.py``
(docs/own-model.md) on the Taobao log."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CRITEO = ROOT.parent / "shared/data/criteo/train_head10k.txt"


@pytest.mark.skipif(not CRITEO.exists(), reason=f"{CRITEO} is absent")
def test_the_own_model_example_trains_and_beats_chance():
    out = subprocess.run([sys.executable, str(ROOT / "examples/own_model.py"), str(CRITEO)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    auc = float(out.stdout.strip().splitlines()[-1].split()[1].rstrip(","))
    assert auc > 0.65, out.stdout


TAOBAO = ROOT.parent / "shared/data/taobao-userbehavior/UserBehavior_head84k.csv"


@pytest.mark.skipif(not TAOBAO.exists(), reason=f"{TAOBAO} is absent")
def test_the_two_task_example_trains_from_yaml_and_from_python_alike(tmp_path, capsys,
                                                                    monkeypatch):
    """``examples/two_tasks.yaml`` (docs/own-model.md) on the Taobao log, a few steps: through
    ``cosparse train --model-path examples`` (model.factory), and through ``cosparse.Trainer``
    on the factory's model, with the same per-task metrics."""
    import json

    import yaml

    import cosparse
    from cosparse.api.factory import MODEL_PATH_ENV
    from cosparse.cli import main

    raw = yaml.safe_load((ROOT / "examples/two_tasks.yaml").read_text())
    raw["data"].update(path=str(TAOBAO), eval_fraction=0.05)  # (the last 5% of events)
    raw["train"].update(steps=4, epochs=None, checkpoint={})  # (no checkpoints in the repo)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.setenv(MODEL_PATH_ENV, "")
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["train", "--config", str(tmp_path / "c.yaml"), "--model-path",
                 str(ROOT / "examples"), "--no-progress", "--metrics-json", os.devnull,
                 "--append"]) == 0
    final = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["final"]
    for key in ("auc.engage", "auc.buy", "logloss.engage", "logloss.buy"):
        assert 0.0 < final[key] < 1.0, key
    assert final["eval_samples"] > 4000 and "auc" not in final
    from two_tasks import build  # (found through --model-path)

    cfg = cosparse.load_config(raw)
    with cosparse.Trainer(build(cfg.tables, 0, **cfg.model.args), cfg, log=lambda m: None) as t:
        metrics = t.fit().metrics
    assert {k: metrics[k] for k in ("auc.engage", "auc.buy")} == {
        k: final[k] for k in ("auc.engage", "auc.buy")}
