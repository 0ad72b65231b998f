"""Smoke test of benchmarks/bench_features.py --quick: rows/s of both readers and their ratio."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared/data/criteo/train_head10k.txt"


def test_bench_features_quick(tmp_path: Path) -> None:
    if not DATA.is_file():
        pytest.skip(f"{DATA} not present")
    out = tmp_path / "b.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_features", "--quick",
                           "--rounds", "1", "--passes", "1", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["features_rows_per_s"] > 0 and res["plain_rows_per_s"] > 0 and res["ratio"] > 0
    assert res["features_computed_per_batch"] == 46 and set(res["consumers"]) == {"dlrm_v1", "deepfm_v1"}
    assert "ratio = " in proc.stdout
