"""Serving the whole model (issue 34, item 6): ``cosparse export`` writes the dense model beside
the rows (its state_dict and how to rebuild it, with why no torch.export program), and the
predictor ``cosparse.serving.load`` gives reproduces the trainer's evaluation probabilities bit
for bit on CPU, for the built-in ``model.kind: dlrm`` and for a ``model.factory`` model; an ID
no table has reads the table's initial row and is counted."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from exactness import base_config
from test_din import TAOBAO, din_mapping

from cosparse.batch import SparseBatch
from cosparse.cli import main
from cosparse.config import ModelConfig
from cosparse.config.validate import validate
from cosparse.data import BatchStream
from cosparse.serving import LookupTable, ServingError, load
from cosparse.store.resident import initial_rows
from cosparse.train.evaluate import joined_batches
from cosparse.train.trainer import Trainer


def _config(tmp, factory: bool):
    cfg = copy.deepcopy(base_config("zipf", "adam"))
    cfg.train.steps = 4
    cfg.train.checkpoint.dir = str(tmp / "ck")
    if factory:  # the zoo's DLRM through model.factory (the same layers as model.kind: dlrm)
        cfg.model = ModelConfig(kind=None, factory="cosparse.models.dlrm:build",
                                args={"bottom": [16, 8], "top": [16, 1]})
    return cfg


def _eval_batches(trainer: Trainer):
    """The eval split's batches as the trainer's evaluation joins them."""
    want = trainer.cfg.data.eval_batch_size or max(trainer.cfg.data.batch_size, 1024)
    with BatchStream(trainer.eval_reader, 0, 2) as s:
        return list(joined_batches(s, want))


def _trained(tmp, factory: bool):
    """(the trainer's eval probabilities, its eval batches, the export dir)."""
    cfg = _config(tmp, factory)
    if factory:
        from cosparse.api.factory import make_trainer

        trainer = make_trainer(validate(cfg), log=lambda m: None)
    else:
        trainer = Trainer(validate(cfg), log=lambda m: None)
    try:
        trainer.run(steps=4, evaluate=False)
        trainer.save()
        trainer.evaluate()
        expected = np.array(trainer.eval_predictions["label"], copy=True)
        batches = _eval_batches(trainer)
    finally:
        trainer.close()
    assert main(["export", "--checkpoint", str(tmp / "ck"), "--out", str(tmp / "ex"),
                 "--format", "npy"]) == 0
    return expected, batches, tmp / "ex"


@pytest.mark.parametrize("factory", [False, True], ids=["kind", "factory"])
def test_predictor_reproduces_the_trainers_eval_bit_for_bit(tmp_path, factory, capsys):
    """A torch.export program of the built-in DLRM's dense part, and of the same DLRM on the
    public API through model.factory (its lookups as the program's inputs)."""
    expected, batches, out = _trained(tmp_path, factory)
    manifest = json.loads((out / "manifest.json").read_text())
    dense = manifest["dense"]
    assert dense["form"] == "state_dict" and (out / dense["file"]["path"]).is_file()
    assert dense["why"] is None and (out / dense["program"]["path"]).is_file()
    assert dense["model"] == ({"factory": "cosparse.models.dlrm:build",
                               "args": {"bottom": [16, 8], "top": [16, 1]}}
                              if factory else {"kind": "dlrm"})
    predictor = load(out)
    got = np.concatenate([predictor.predict(b)["label"].numpy() for b in batches])
    assert got.dtype == np.float32 and got.shape == expected.shape
    assert predictor.form == "program"
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))
    # every eval ID the run never trained on is counted (eval creates no rows)
    assert sum(predictor.unknown_ids.values()) > 0
    # the fallback, the model rebuilt from its state_dict: the same bits
    rebuilt = load(out, use_program=False)
    again = np.concatenate([rebuilt.predict(b)["label"].numpy() for b in batches])
    assert rebuilt.form == "state_dict"
    assert np.array_equal(again.view(np.uint32), expected.view(np.uint32))
    assert rebuilt.unknown_ids == predictor.unknown_ids


def _one_sample(batch, ids_of: dict[str, int]) -> SparseBatch:
    """A one-sample batch: ID ``ids_of[feature]`` in every feature's bag, the first sample's
    dense inputs."""
    return SparseBatch(keys=list(batch.keys),
                       values=torch.tensor([ids_of[k] for k in batch.keys], dtype=torch.int64),
                       lengths=torch.ones(len(batch.keys), dtype=torch.int64),
                       dense=batch.dense[:1].clone(), labels=torch.zeros(1))


def test_an_unknown_id_reads_the_initial_row_and_is_counted(tmp_path):
    _, batches, out = _trained(tmp_path, factory=False)
    served = load(out)
    lo, hi = served["lo"], served["hi"]
    new_id = int(lo.ids.max()) + 12345  # never seen in training
    lo_features = next(t.features for t in served._tables_config() if t.name == "lo")
    ids_of = {k: new_id if k in lo_features else int(hi.ids[0]) for k in batches[0].keys}
    batch = _one_sample(batches[0], ids_of)
    got = served.predict(batch)["label"]
    assert served.unknown_ids == {"lo": 1, "hi": 0}
    # the same export with the new ID's initial row written into the table: the same bits
    reference = load(out)
    cfg = next(t for t in reference._tables_config() if t.name == "lo")
    init = initial_rows(cfg, cfg.dim, np.array([new_id], np.int64))
    ids = np.concatenate([lo.ids, [new_id]])
    reference["lo"] = LookupTable("lo", lo.dim, lo.step, ids, np.concatenate([lo.rows, init]))
    want = reference.predict(batch)["label"]
    assert reference.unknown_ids == {"lo": 0, "hi": 0}
    assert np.array_equal(got.numpy().view(np.uint32), want.numpy().view(np.uint32))
    # and a table's initial row is not a zero row: the fallback is the trainer's, not zeros
    assert np.any(init != 0)


def test_an_export_without_its_dense_model_refuses_to_predict(tmp_path):
    _, batches, out = _trained(tmp_path, factory=False)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["dense"]["model"] = None
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ServingError, match="no model to predict with"):
        load(out).predict(batches[0])


@pytest.mark.skipif(not TAOBAO.exists(), reason="the Taobao sample is not in ../shared/data")
def test_a_built_in_din_is_served_from_its_program(tmp_path):
    """The zoo's DIN (jagged histories into attention) exports through the same program as a
    user's model: its lookups as inputs; the program and the rebuilt model both reproduce the
    trainer's eval predictions bit for bit."""
    from cosparse.config import config_from_mapping

    raw = din_mapping(**{"data.batch_size": 64, "data.events.max_len": 20,
                         "data.eval_fraction": 0.02, "train.steps": 3, "train.epochs": None})
    raw["train"]["checkpoint"] = {"dir": str(tmp_path / "ck"), "every": 3}
    trainer = Trainer(config_from_mapping(raw), log=lambda m: None)
    try:
        trainer.run(steps=3, evaluate=False)
        trainer.evaluate()
        expected = np.array(trainer.eval_predictions["label"], copy=True)
        batches = _eval_batches(trainer)
    finally:
        trainer.close()
    assert main(["export", "--checkpoint", str(tmp_path / "ck"), "--out", str(tmp_path / "ex"),
                 "--format", "npy"]) == 0
    dense = json.loads((tmp_path / "ex" / "manifest.json").read_text())["dense"]
    assert dense["why"] is None, dense["why"]
    assert dense["inputs"]["jagged"] == ["target_item", "hist_item", "target_cate", "hist_cate"]
    for use_program in (True, False):
        served = load(tmp_path / "ex", use_program=use_program)
        got = np.concatenate([served.predict(b)["label"].numpy() for b in batches])
        assert served.form == ("program" if use_program else "state_dict")
        assert np.array_equal(got.view(np.uint32), expected.view(np.uint32)), use_program


def test_an_export_written_before_the_zoo_moved_still_predicts_bit_for_bit():
    """``tests/data/export_c81b903``: an old export's pooled-only program and its state_dict of
    the old keys both reproduce the old trainer's eval probabilities."""
    from cosparse.config import config_from_mapping
    from cosparse.train.inputs import model_inputs

    old = Path(__file__).resolve().parent / "data" / "export_c81b903"
    expected = np.load(old / "expected.npy")
    cfg = config_from_mapping(json.loads((old / "manifest.json").read_text())["dense"]["config"])
    with BatchStream(model_inputs(cfg).eval, 0, 2) as s:
        batches = list(joined_batches(s, cfg.data.eval_batch_size))
    for use_program in (True, False):
        served = load(old, use_program=use_program)
        got = np.concatenate([served.predict(b)["label"].numpy() for b in batches])
        assert served.form == ("program" if use_program else "state_dict")
        assert np.array_equal(got.view(np.uint32), expected.view(np.uint32)), use_program
