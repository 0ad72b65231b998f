"""Issue 34's "done when", on one model outside ``cosparse/`` (``tests/full_model.py``: two
tasks, a pooled table and a sequence table, dense inputs, per-sample weights): bit-identical on
every placement and across a resume (``cosparse.check``), which catches the non-deterministic
variant; from YAML through ``model.factory`` with the numbers of the Python model; exported and
served with each task's eval predictions reproduced bit for bit; on 2 ranks within the
parallelism tolerance, the loss summed over the global batch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from full_model import TABLES, EntropyDropout, FullModel, mapping, new_model, write_csv

import cosparse
from cosparse.cli import main
from cosparse.data import BatchStream
from cosparse.serving import load
from cosparse.serving.program import export_model_program
from cosparse.train.evaluate import joined_batches
from cosparse.train.placements import CHECKED
from tests.torchrun import run_ranks

ROOT = Path(__file__).resolve().parent.parent
STEPS = 6


@pytest.fixture(scope="module")
def csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("full") / "d.csv"
    write_csv(path)
    return path


def _fit_python(raw: dict) -> tuple[cosparse.RunResult, dict[str, np.ndarray], list, dict]:
    """The model given in Python: its run, eval predictions, eval batches and dense weights."""
    cfg = cosparse.load_config(raw)
    model = new_model(cfg.train.seed)  # (the seed the factory is called under)
    with cosparse.Trainer(model, cfg, log=lambda m: None) as trainer:
        result = trainer.fit()
        engine = trainer.engine
        predictions = {k: v.copy() for k, v in engine.eval_predictions.items()}
        want = engine.cfg.data.eval_batch_size or max(engine.cfg.data.batch_size, 1024)
        with BatchStream(engine.eval_reader, 0, 2) as s:
            batches = list(joined_batches(s, want))
    dense = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return result, predictions, batches, dense


def test_check_passes_on_every_placement_and_catches_the_nondeterministic_variant(csv):
    result = cosparse.check(FullModel, mapping(csv, STEPS), steps=STEPS, log=lambda m: None)
    assert list(result.distances) == list(CHECKED)
    assert result.ok, result.table()
    assert not result.notes, result.notes  # every tier moved rows; the spill reached the PS
    caught = cosparse.check(EntropyDropout, mapping(csv, STEPS), steps=2, log=lambda m: None,
                            placements=("tiered",))
    assert not caught.ok and caught.distances["tiered"].loss > 0, caught.table()


def test_yaml_factory_trains_as_python_and_the_export_serves_each_task(csv, tmp_path):
    raw = mapping(csv, STEPS)
    raw["train"]["log_every"] = 1
    py, predictions, batches, _ = _fit_python(raw)
    assert sorted(predictions) == ["ctr", "watch"] and np.isfinite(py.losses).all()
    assert {"auc.ctr", "gauc.ctr", "mse.watch", "mae.watch"} <= set(py.metrics)

    raw["model"] = {**raw["model"], "factory": "full_model:build"}
    raw["tables"] = TABLES  # (the Python model carries them; a factory is given them)
    raw["train"]["checkpoint"] = {"dir": str(tmp_path / "ck"), "every": STEPS}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    code = main(["train", "--config", str(tmp_path / "c.yaml"), "--no-progress",
                 "--model-path", str(ROOT / "tests"), "--metrics-json", str(tmp_path / "m.jsonl")])
    assert code == 0
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in records if r["kind"] == "train"] == py.losses

    assert main(["export", "--checkpoint", str(tmp_path / "ck"), "--out", str(tmp_path / "ex"),
                 "--format", "npy"]) == 0
    manifest = json.loads((tmp_path / "ex" / "manifest.json").read_text())
    assert manifest["dense"]["why"] is None, manifest["dense"]["why"]
    assert manifest["dense"]["inputs"] == {"num_dense": 2, "features": ["user", "item"],
                                           "jagged": ["hist"]}
    for use_program in (True, False):  # the torch.export program, and the model rebuilt
        served = load(tmp_path / "ex", use_program=use_program)
        got = [served.predict(b) for b in batches]
        for task, want in predictions.items():
            joined = np.concatenate([g[task].numpy() for g in got])
            assert joined.dtype == np.float32 and joined.shape == want.shape, task
            assert np.array_equal(joined.view(np.uint32), want.view(np.uint32)), task
        assert 0 < got[0]["ctr"].min() and got[0]["ctr"].max() < 1  # probabilities
        assert served.form == ("program" if use_program else "state_dict")
        assert sum(served.unknown_ids.values()) > 0


def test_two_ranks_train_it_as_one_process_does(csv, tmp_path):
    """DDP over the dense layers, the pooled table whole on one rank and the sequence table
    row-wise; each rank's summed loss over the global batch size, so the losses, metrics and
    dense weights match one process within float tolerance (sums in another order)."""
    out = tmp_path / "rank0.pt"
    run_ranks(ROOT / "tests/full_model_ranks.py",
              [str(csv), json.dumps({"ids": "table_wise", "history": "row_wise"}), str(out)], 120)
    got = torch.load(out)
    ref, _, _, dense = _fit_python(mapping(csv))
    assert got["metrics"]["world_size"] == 2
    np.testing.assert_allclose(got["losses"], ref.losses, rtol=1e-5)
    for key in ("auc.ctr", "gauc.ctr", "mse.watch"):
        assert got["metrics"][key] == pytest.approx(ref.metrics[key], rel=1e-4), key
    for k, v in dense.items():
        torch.testing.assert_close(got["dense"][k], v, rtol=1e-5, atol=1e-6)


class _ReadsIds(FullModel):
    def forward(self, batch):
        assert batch.sparse.keys()
        return super().forward(batch)


def test_a_model_that_reads_the_ids_is_served_from_its_state_dict(tmp_path):
    """The program's inputs are the lookups: a forward that reads ``batch.sparse`` cannot be
    exported, and the error (the export's ``why``) says so."""
    with pytest.raises(AttributeError, match="must not read batch.sparse to be exported"):
        export_model_program(_ReadsIds(), ["ctr", "watch"], 2, tmp_path / "p.pt2")
    got = export_model_program(FullModel(), ["ctr", "watch"], 2, tmp_path / "p.pt2")
    assert got == {"num_dense": 2, "features": ["user", "item"], "jagged": ["hist"]}
