"""``examples/own_model.py`` (README's "Your own model") runs as written and learns: a model of
one's own on Criteo's first 10,000 lines, under a bounded device tier."""

from __future__ import annotations

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
