"""`cosparse train` end to end as a real subprocess: outputs, TensorBoard events, error exits."""

import json
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def _run(args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "cosparse.cli", *args], cwd=cwd, capture_output=True, text=True,
        timeout=300,
    )


def _config(tmp_path, **data):
    cfg = yaml.safe_load((REPO / "configs/demo.yaml").read_text())
    cfg["data"].update(batch_size=256, workers=1, **data)
    cfg["data"]["synthetic"].update(num_batches=20, eval_batches=2, vocab_size=5000)
    cfg["train"].update(
        steps=12, log_every=4, metrics_json=str(tmp_path / "m.jsonl"),
        tensorboard_dir=str(tmp_path / "tb"), checkpoint={"dir": str(tmp_path / "ck"), "every": 6},
    )
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def test_train_command_writes_metrics_tensorboard_and_checkpoints(tmp_path):
    r = _run(["train", "--config", str(_config(tmp_path)), "--no-progress"], tmp_path)
    assert r.returncode == 0, r.stderr
    final = json.loads(r.stdout.strip().splitlines()[-1])["final"]
    assert final["step"] == 12 and 0 < final["auc"] < 1
    assert "eval @ step 12: auc" in r.stderr + r.stdout
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert (tmp_path / "ck" / "LATEST").read_text() == "step_00000012"
    records = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == [4, 8, 12]
    # resume at the last checkpoint with more steps
    r2 = _run(["train", "--config", str(_config(tmp_path)), "--no-progress", "--steps", "14",
               "--resume", str(tmp_path / "ck")], tmp_path)
    assert r2.returncode == 0, r2.stderr
    assert "resumed from" in r2.stderr + r2.stdout
    assert json.loads(r2.stdout.strip().splitlines()[-1])["final"]["step"] == 14


def test_config_error_exits_nonzero_naming_the_key(tmp_path):
    p = _config(tmp_path)
    cfg = yaml.safe_load(p.read_text())
    cfg["train"]["stepz"] = 3
    p.write_text(yaml.safe_dump(cfg))
    r = _run(["train", "--config", str(p)], tmp_path)
    assert r.returncode == 2
    assert "unknown key 'train.stepz'" in r.stderr


def test_missing_data_file_is_a_clear_error(tmp_path):
    p = _config(tmp_path, reader="criteo_tsv", path=str(tmp_path / "nope.tsv"))
    r = _run(["train", "--config", str(p)], tmp_path)
    assert r.returncode != 0
    assert "nope.tsv" in r.stderr and "Traceback" not in r.stderr


def test_python_dash_m_cosparse_is_the_command_line(tmp_path):
    """``python -m cosparse`` (what ``torchrun -m cosparse`` starts) runs the same command line:
    the same one-line error and exit code as the ``cosparse`` script."""
    p = _config(tmp_path)
    cfg = yaml.safe_load(p.read_text())
    cfg["train"]["stepz"] = 3
    p.write_text(yaml.safe_dump(cfg))
    r = subprocess.run([sys.executable, "-m", "cosparse", "train", "--config", str(p)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unknown key 'train.stepz'" in r.stderr
