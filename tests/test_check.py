"""``cosparse check`` and ``cosparse.check`` (issue 34, item 4): a model of the user's own, and
a built-in one from a config, train bit-identically on every placement and across a resume;
a model whose dropout is seeded from the OS is caught (``ok`` False, exit 1), and so is one ulp
of corruption in the device tier's write-back."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from check_models import EntropyDropout, GlobalDropout
from public_model import UserModel, mapping

import cosparse
from cosparse.cli import main
from cosparse.config import ConfigError
from cosparse.train.placements import CHECKED

ROOT = Path(__file__).resolve().parents[1]


def test_the_user_model_is_bit_identical_on_every_placement():
    result = cosparse.check(UserModel, mapping(), steps=6, log=lambda m: None)
    assert list(result.distances) == list(CHECKED)
    assert result.ok, result.table()
    assert not result.notes, result.notes  # every tier moved rows; the spill reached the PS
    for d in result.distances.values():
        assert (d.loss, d.rows, d.dense) == (0.0, 0.0, 0.0) and d.first is None
    assert result.table().splitlines()[1].split()[:4] == ["tiered", "0", "0", "0"]


def test_dropout_from_the_global_generator_is_reproducible():
    """The trainer seeds torch's generator and a checkpoint restores it: such dropout draws the
    same masks on every placement and across a resume."""
    result = cosparse.check(GlobalDropout, mapping(), steps=4, log=lambda m: None,
                            placements=("collaborative", "resume"))
    assert result.ok, result.table()


def test_dropout_seeded_from_the_os_is_caught():
    result = cosparse.check(EntropyDropout, mapping(), steps=4, log=lambda m: None,
                            placements=("tiered", "resume"))
    assert not result.ok
    for name, d in result.distances.items():
        assert not d.identical and d.first.startswith("loss differs first at step 1"), name
        assert 0 < d.loss < math.inf and 0 < d.rows < math.inf and 0 < d.dense < math.inf
    assert "NO: loss differs" in result.table()


def test_a_model_object_is_copied_and_a_bad_argument_is_named():
    model = UserModel()
    result = cosparse.check(model, mapping(), steps=2, placements=("tiered",),
                            log=lambda m: None)
    assert result.ok and model.embeddings._engine is None  # the runs trained copies
    with pytest.raises(ConfigError, match=r"placements: \['nope'\]"):
        cosparse.check(UserModel, mapping(), placements=("nope",))
    with pytest.raises(ConfigError, match="--steps: 1; the check needs at least 2"):
        cosparse.check(UserModel, mapping(), steps=1)
    with pytest.raises(ConfigError, match="model.kind: the config names no "
                                                          "built-in model"):
        cosparse.check(None, cosparse.load_config(mapping()))


def _dlrm_config(tmp_path) -> str:
    raw = {
        "data": {"reader": "synthetic", "batch_size": 64, "workers": 0,
                 "synthetic": {"num_features": 4, "num_dense": 3, "vocab_size": 3000,
                               "alpha": 1.05, "bag_min": 1, "bag_max": 3, "seed": 7,
                               "num_batches": 8, "eval_batches": 1}},
        "model": {"kind": "dlrm", "bottom": [8, 4], "top": [8, 1]},
        "tables": [{"name": "t", "dim": 4, "features": ["C1", "C2", "C3", "C4"],
                    "optimizer": {"kind": "rowwise_adagrad", "lr": 0.05}}],
        "train": {"steps": 6, "threads": 1, "checkpoint": {"dir": str(tmp_path / "never"),
                                                          "every": 2}},
        "supply": {"lookahead": 1},
    }
    path = tmp_path / "dlrm.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def test_the_command_passes_a_built_in_model(tmp_path, capsys):
    """(test_exactness.py covers every placement of the built-in models; here the command.)"""
    assert main(["check", "--config", _dlrm_config(tmp_path), "--only", "spill,resume"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["placement", "loss", "rows", "dense", "bit-identical"]
    assert [line.split()[0] for line in lines[1:3]] == ["spill", "resume"]
    assert "bit-identical on every placement (6 steps)" in out and "note:" not in out
    assert not (tmp_path / "never").exists()  # the check writes no checkpoint of the config's


def test_the_command_exits_1_on_one_ulp_of_corruption(tmp_path, capsys, monkeypatch):
    from cosparse.store.tiered import TieredTable

    original, done = TieredTable._host_put, []

    def corrupting_host_put(self, ids, hs, src, seq):
        if not done and src.shape[0]:  # one row nudged by one ulp on its way down
            row = self.dev.slab_np[src[0]]
            row[0] = np.nextafter(row[0], np.float32(np.inf))
            done.append(int(ids[0]))
        return original(self, ids, hs, src, seq)

    monkeypatch.setattr(TieredTable, "_host_put", corrupting_host_put)
    assert main(["check", "--config", _dlrm_config(tmp_path), "--steps", "4",
                 "--only", "tiered"]) == 1
    assert done
    out = capsys.readouterr().out
    assert "NOT bit-identical" in out and "tiered" in out and "NO: " in out


def test_the_command_line_parser_loads_no_torch():
    """``ps serve`` builds the whole parser: a command whose parser imported torch (or numba)
    would slow every PS shard's start by seconds."""
    code = ("import sys; from cosparse.cli import build_parser; build_parser(); "
            "heavy = [m for m in ('torch', 'numba') if m in sys.modules]; "
            "assert not heavy, heavy")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
