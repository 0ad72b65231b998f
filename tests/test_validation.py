"""Bad runs end early and clearly (issue 11, defects 9 and 10): a non-finite loss stops the run
at its step (or the batch is skipped with nothing applied), an empty data file is an error
naming it, and undefined metrics are written as JSON ``null``, never a bare NaN."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from cosparse.config import Config, config_from_mapping
from cosparse.data import SyntheticReader
from cosparse.train.inputs import ModelInputs
from cosparse.train.nonfinite import NonFiniteLoss
from cosparse.train.trainer import Trainer

CRITEO = Path(__file__).resolve().parents[2] / "shared/data/criteo/train_head10k.txt"
needs_criteo = pytest.mark.skipif(not CRITEO.is_file(), reason=f"{CRITEO} not present")


def _strict(text: str) -> object:
    """json.loads that refuses NaN and Infinity (Python's json accepts them by default)."""
    def refuse(name: str) -> None:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def _raw(tmp_path: Path, **train) -> dict:
    return {
        "data": {"reader": "synthetic", "batch_size": 64,
                 "synthetic": {"num_features": 4, "vocab_size": 300, "num_batches": 40,
                               "eval_batches": 2, "seed": 3}},
        "model": {"kind": "dlrm", "bottom": [8, 4], "top": [8, 1]},
        "tables": [{"name": "t", "dim": 4, "features": ["C1", "C2", "C3", "C4"]}],
        "supply": {"lookahead": 2},
        "train": {"steps": 10, "progress": False, "log_every": 3,
                  "metrics_json": str(tmp_path / "m.jsonl"), **train},
    }


class PoisonedReader:
    """The synthetic reader, with the dense features of batches ``poison`` set to NaN (a data
    spike that makes exactly those steps' losses NaN)."""

    def __init__(self, inner: SyntheticReader, poison: set[int]) -> None:
        self.inner, self.poison = inner, poison
        self.keys, self.num_dense = inner.keys, inner.num_dense

    @property
    def num_batches(self) -> int:
        return self.inner.num_batches

    def tasks(self, start_batch: int = 0):
        return self.inner.tasks(start_batch)

    def build(self, task):
        batch = self.inner.build(task)
        if batch.index in self.poison:
            batch.dense.fill_(math.nan)
        return batch


def _trainer(cfg: Config, poison: set[int]) -> Trainer:
    d = cfg.data
    inputs = ModelInputs(cfg, PoisonedReader(SyntheticReader(d.synthetic, d.batch_size), poison),
                         SyntheticReader(d.synthetic, d.batch_size, "eval"))
    return Trainer(cfg, log=lambda m: None, inputs=inputs)


def _snapshot(t: Trainer) -> dict:
    rows = {n: {k: v.copy() for k, v in r.items()} for n, r in t.ec.export_rows().items()}
    dense = {k: v.clone() for k, v in t.model.state_dict().items()}
    opt = {i: {k: v.clone() for k, v in s.items() if torch.is_tensor(v)}
           for i, s in t.dense_opt.state_dict()["state"].items()}
    return {"rows": rows, "dense": dense, "opt": opt}


def _same(a: dict, b: dict) -> bool:
    for name in a["rows"]:
        ra, rb = a["rows"][name], b["rows"][name]
        order_a, order_b = ra["ids"].argsort(), rb["ids"].argsort()
        ids_a, ids_b = ra["ids"][order_a], rb["ids"][order_b]
        common = set(ids_a.tolist()) & set(ids_b.tolist())
        ma = torch.isin(torch.from_numpy(ids_a), torch.tensor(sorted(common))).numpy()
        mb = torch.isin(torch.from_numpy(ids_b), torch.tensor(sorted(common))).numpy()
        # rows and their optimizer state (where a row is placed may change, its value not)
        if not (ra["rows"][order_a][ma] == rb["rows"][order_b][mb]).all():
            return False
    return (all(torch.equal(a["dense"][k], b["dense"][k]) for k in a["dense"])
            and all(torch.equal(a["opt"][i][k], b["opt"][i][k]) for i in a["opt"] for k in a["opt"][i]))


def test_nonfinite_loss_stops_at_its_step_before_any_update(tmp_path):
    clean = Trainer(config_from_mapping(_raw(tmp_path / "clean")), log=lambda m: None)
    try:
        clean.run(steps=4, evaluate=False)
        want = _snapshot(clean)
    finally:
        clean.close()
    t = _trainer(config_from_mapping(_raw(tmp_path)), poison={4})
    try:
        with pytest.raises(NonFiniteLoss, match=r"the loss is nan at step 5 \(epoch 0, batch 4"):
            t.run()
        assert t.state.step == 4 and len(t.losses) == 4
        assert _same(_snapshot(t), want)  # batch 4 changed nothing
    finally:
        t.close()
    steps = [r["step"] for r in map(_strict, (tmp_path / "m.jsonl").read_text().splitlines())]
    assert max(steps) == 3  # nothing logged past the failing step


@pytest.mark.parametrize("arch", ["resident", "tiered", "arch-a"])
def test_skip_batch_applies_nothing_and_counts(tmp_path, arch):
    raw = _raw(tmp_path, on_nonfinite="skip_batch")
    if arch == "tiered":
        raw["store"] = {"device": {"rows": 200}, "host": {"rows": 300, "spill": True}}
    if arch == "arch-a":  # the PS applies the updates: a skipped batch pushes nothing
        raw.update(preset="arch-a", store={"remote": {"num_shards": 1}})
    t = _trainer(config_from_mapping(raw), poison={4, 7})
    original = t._train_step
    skipped: list[int] = []

    def observed(prepared):
        before = _snapshot(t)
        loss = original(prepared)
        if not math.isfinite(loss):
            skipped.append(prepared.batch.index)
            assert _same(_snapshot(t), before), "a skipped batch changed rows or dense weights"
        return loss

    t._train_step = observed
    try:
        final = t.run()
    finally:
        t.close()
    assert skipped == [4, 7] and t.skipped_batches == 2 and t.state.step == 10
    assert [i for i, x in enumerate(t.losses) if not math.isfinite(x)] == [4, 7]
    records = [_strict(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert all(r["loss"] is not None and math.isfinite(r["loss"]) for r in train)
    assert final["skipped_batches"] == 2 and math.isfinite(final["auc"])


@needs_criteo
def test_one_class_eval_writes_null_auc_as_strict_json(tmp_path, capsys):
    from cosparse.cli import main

    lines = CRITEO.read_text().splitlines()[:200]
    lines = lines[:160] + ["0" + x[1:] for x in lines[160:]]  # the eval split is all negatives
    data = tmp_path / "one_class.txt"
    data.write_text("\n".join(lines) + "\n")
    cfg = {"data": {"reader": "criteo_tsv", "path": str(data), "batch_size": 40,
                    "eval_fraction": 0.2},
           "model": {"kind": "dlrm", "bottom": [8, 4], "top": [8, 1]},
           "tables": [{"name": "c", "dim": 4, "features": [f"C{i}" for i in range(1, 27)]}],
           "train": {"steps": 4, "log_every": 2, "metrics_json": str(tmp_path / "m.jsonl")}}
    p = tmp_path / "c.yaml"
    p.write_text(json.dumps(cfg))
    assert main(["train", "--config", str(p), "--no-progress"]) == 0
    final = _strict(capsys.readouterr().out.strip().splitlines()[-1])["final"]
    assert final["auc"] is None and math.isfinite(final["logloss"]) and final["step"] == 4
    records = [_strict(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["auc"] for r in records if r["kind"] in ("eval", "final")] == [None, None]


@needs_criteo
def test_compare_json_writes_null_for_an_undefined_auc(tmp_path):
    from cosparse.report.compare import compare

    lines = CRITEO.read_text().splitlines()[:100]
    data = tmp_path / "one_class.txt"
    data.write_text("\n".join(lines[:80] + ["1" + x[1:] for x in lines[80:]]) + "\n")
    cfg = {"data": {"reader": "criteo_tsv", "path": str(data), "batch_size": 40},
           "model": {"kind": "dlrm", "bottom": [8, 4], "top": [8, 1]},
           "tables": [{"name": "c", "dim": 4, "features": [f"C{i}" for i in range(1, 27)]}]}
    p = tmp_path / "c.yaml"
    p.write_text(json.dumps(cfg))
    compare(p, "resident", "resident", 2, tmp_path / "out", warmup=0, log=lambda m: None)
    doc = _strict((tmp_path / "out" / "compare.json").read_text())
    assert doc["runs"]["a"]["auc"] is None and doc["runs"]["b"]["auc"] is None


def test_empty_data_file_fails_the_run_naming_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # (a metrics directory under runs/ there)
    from cosparse.cli import main

    data = tmp_path / "empty.txt"
    data.write_text("")
    cfg = {"data": {"reader": "criteo_tsv", "path": str(data), "batch_size": 8},
           "model": {"kind": "dlrm", "bottom": [8, 4], "top": [8, 1]},
           "tables": [{"name": "c", "dim": 4, "features": ["C1", "C2"]}],
           "train": {"steps": 4}}
    p = tmp_path / "c.yaml"
    p.write_text(json.dumps(cfg))
    assert main(["train", "--config", str(p), "--no-progress"]) == 3
    assert f"{data}: the data file has no lines" in capsys.readouterr().err
