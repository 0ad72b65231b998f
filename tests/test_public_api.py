"""The public Python API (issue 34, first part): a model defined here, outside ``cosparse/``,
trains through ``cosparse.Trainer`` bit-identically (losses, rows with their optimizer state,
dense parameters) under the all-resident engine, bounded device tiers, ps-direct and
collaborative (architecture B); a save and resume continues the same numbers; and the refusals
(no collection, two, an unplaced one, a built-in model kind, an objective) say what is wrong."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from public_model import STEPS, TABLES, TwoCollections, UserModel, mapping, new_model
from torch import nn

import cosparse
from cosparse.config import ConfigError, switch_preset
from tests.torchrun import run_ranks

ROOT = Path(__file__).resolve().parents[1]
PS = {"embedded": True, "num_shards": 2}


def train(raw: dict, build: Callable[[], nn.Module] = new_model) -> dict:
    """Losses, rows (sorted by ID) and dense parameters of the user's model (``build()``)
    trained under ``raw``."""
    model = build()
    with cosparse.Trainer(model, cosparse.load_config(raw), log=lambda m: None) as trainer:
        result = trainer.fit()
        rows = {}
        for name, state in trainer._engine.ec.export_rows().items():
            order = np.argsort(state["ids"])
            rows[name] = (state["ids"][order], state["rows"][order])
        counters = trainer._engine.ec.counters()
        delivering = getattr(trainer._engine.path, "counters_b", None)  # (architecture B)
    return {"losses": result.losses, "rows": rows, "metrics": result.metrics,
            "dense": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
            "evictions": sum(c.evictions_device for c in counters.values()),
            "delivered_batches": delivering.batches if delivering is not None else 0}


def difference(got: dict, ref: dict) -> str | None:
    """None when bit-identical, else the first difference."""
    if got["losses"] != ref["losses"]:
        return f"losses differ: {got['losses']} vs {ref['losses']}"
    for name, (ids, rows) in ref["rows"].items():
        gids, grows = got["rows"][name]
        if not np.array_equal(gids, ids):
            return f"table '{name}': other row IDs ({gids.shape[0]} vs {ids.shape[0]})"
        if not np.array_equal(grows, rows):
            return f"table '{name}': {int((grows != rows).any(axis=1).sum())} rows differ"
    for k, v in ref["dense"].items():
        if not torch.equal(got["dense"][k], v):
            return f"dense parameter '{k}' differs"
    return None


_REFERENCE: dict = {}


def reference() -> dict:
    if not _REFERENCE:
        _REFERENCE.update(train(mapping()))
    return _REFERENCE


PLACEMENTS = {
    "tiered": {"store": {"device": {"rows": 600}}, "supply": {"lookahead": 1}},
    "ps-direct": {"store": {"remote": PS}, "supply": {"path": "ps-direct", "lookahead": 1}},
    "collaborative": None,  # arch-b, below
}


def placement(name: str) -> dict:
    if name == "collaborative":
        raw = switch_preset(mapping(), "arch-b", {"store.remote.embedded": True,
                                                   "store.remote.num_shards": 2,
                                                   "store.device.rows": 600,
                                                   "store.host.rows": 1200,
                                                   "supply.lookahead": 2})
        raw["data"]["workers"] = 2
        return raw
    return mapping(**PLACEMENTS[name])


def test_the_user_model_trains_and_reports_the_final_metrics():
    ref = reference()
    assert len(ref["losses"]) == STEPS and all(np.isfinite(ref["losses"]))
    m = ref["metrics"]
    assert m["step"] == STEPS and m["steps_trained"] == STEPS and m["samples_per_s"] > 0
    assert m["auc.label"] == m["auc"] and m["logloss.label"] == m["logloss"]
    assert "cpu.threads" in m or any(k.startswith("cpu.") for k in m)  # nested figures, dotted
    assert "dense_in.weight" in ref["dense"] and ref["dense"]["dense_in.weight"].shape == (8, 3)
    assert set(ref["rows"]) == {"items", "history"} and ref["rows"]["history"][0].shape[0] > 0


@pytest.mark.parametrize("name", ["tiered", "ps-direct", "collaborative"])
def test_the_user_model_is_bit_identical_on_every_placement(name):
    got = train(placement(name))
    assert difference(got, reference()) is None, f"{name}: {difference(got, reference())}"
    if name != "ps-direct":
        assert got["evictions"] > 0  # the device tier really moved rows
    if name == "collaborative":
        assert got["delivered_batches"] == STEPS  # the data workers delivered the cold rows


def test_save_then_resume_goes_on_with_the_same_numbers(tmp_path):
    """Two saves into one directory, then a resume from the older: the PS restarts from its
    snapshots (the newer save kept the older's), the collection is placed anew, and the run
    goes on as if never stopped."""
    raw = placement("ps-direct")
    raw["store"]["remote"] = {"embedded": True, "num_shards": 1, "data_dir": str(tmp_path / "ps")}
    model = new_model()
    with cosparse.Trainer(model, cosparse.load_config(raw), log=lambda m: None) as first:
        losses = first.fit(3).losses
        older = first.save(tmp_path / "ck")
        first.fit(5)
        first.save(tmp_path / "ck")
    assert older.name == "step_00000003"
    model = new_model(seed=1)  # (its dense values come from the checkpoint)
    with cosparse.Trainer(model, cosparse.load_config(raw), log=lambda m: None) as second:
        before = model.embeddings._engine
        second.resume(older)
        assert model.embeddings._engine is not before  # placed on the restarted PS
        losses += second.fit().losses
        rows = {}
        for name, state in second._engine.ec.export_rows().items():
            order = np.argsort(state["ids"])
            rows[name] = (state["ids"][order], state["rows"][order])
    got = {"losses": losses, "rows": rows,
           "dense": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}}
    assert difference(got, reference()) is None


def test_two_ranks_train_the_user_model_as_one_process_does(tmp_path):
    """DDP over the user's dense layers, its tables sharded over 2 gloo ranks (the sequence
    table row-wise: rows per ID, exact); losses and dense weights within the parallelism
    tolerance (1e-6 relative: DDP sums the dense gradients in another order)."""
    out = tmp_path / "rank0.pt"
    run_ranks(ROOT / "tests/public_ranks.py",
              [json.dumps({"items": "table_wise", "history": "row_wise"}), str(out)], 120)
    got, ref = torch.load(out), reference()
    assert got["metrics"]["world_size"] == 2
    np.testing.assert_allclose(got["losses"], ref["losses"], rtol=1e-6)
    for k, v in ref["dense"].items():
        torch.testing.assert_close(got["dense"][k], v, rtol=1e-6, atol=1e-7)


def test_lazy_layers_take_the_same_values_whatever_drew_random_numbers_before():
    cfg = cosparse.load_config(mapping())
    values = []
    for noise in (0, 1000):
        model = new_model()
        torch.rand(noise)
        with cosparse.Trainer(model, cfg, log=lambda m: None):
            values.append(model.dense_in.weight.detach().cpu().clone())
    assert torch.equal(values[0], values[1])


# --- the config ---------------------------------------------------------------------------------
def test_a_config_for_a_user_model_needs_no_model_or_tables_section():
    raw = mapping()
    del raw["model"]
    cfg = cosparse.load_config(raw)
    assert cfg.model.kind is None and cfg.tables == []
    raw["tables"] = TABLES
    assert len(cosparse.load_config(raw).tables) == 2
    with pytest.raises(ConfigError, match=r"model\.dropout: 0\.5 is the built-in models'"):
        cosparse.load_config({**raw, "model": {"dropout": 0.5}})
    # what names tables is checked once the model's collection has brought them
    sharded = cosparse.load_config(mapping(parallel={"sharding": {"nope": "table_wise"}}))
    with pytest.raises(ConfigError, match=r"parallel\.sharding\.nope: no table is named 'nope' "
                                          r"\(tables: items, history\)"):
        cosparse.Trainer(UserModel(), sharded)


def test_config_refusals_name_the_key():
    model = UserModel()
    builtin = cosparse.load_config({**mapping(), "model": {"kind": "dcn"}, "tables": TABLES[:1]})
    with pytest.raises(ConfigError, match=r"model\.kind: 'dcn' names a built-in model"):
        cosparse.Trainer(model, builtin)
    other = [{**TABLES[0], "dim": 16}, TABLES[1]]
    with pytest.raises(ConfigError, match=r"tables: the config's tables differ .*\['items'\]"):
        cosparse.Trainer(model, cosparse.load_config({**mapping(), "tables": other}))
    with pytest.raises(ConfigError, match=r"EmbeddingBagCollection tables\[0\]\.dim: must be"):
        cosparse.EmbeddingBagCollection([{**TABLES[0], "dim": 0}])
    with pytest.raises(ConfigError, match=r"EmbeddingBagCollection unknown key 'tables\[1\]\.dims'"):
        cosparse.EmbeddingBagCollection([TABLES[0], {"name": "x", "dims": 4}])
    with pytest.raises(TypeError, match=r"objective=\.\.\.\): a cosparse\.Objective"):
        cosparse.Trainer(model, cosparse.load_config(mapping()), objective="mse")  # type: ignore[arg-type]


# --- the model ----------------------------------------------------------------------------------
class _SharedTable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = cosparse.EmbeddingBagCollection(TABLES[:1])
        self.towers = nn.ModuleList([cosparse.EmbeddingBagCollection(TABLES[:1])])


class _SharedFeature(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = cosparse.EmbeddingBagCollection(TABLES[:1])
        self.b = cosparse.EmbeddingBagCollection([{**TABLES[1], "features": ["C3"]}])


def test_every_collection_in_the_model_is_found_and_placed():
    """Two collections (one nested, as one per tower) train the numbers of one collection
    holding both tables: one engine looks every table up once per batch. Under architecture B,
    the data workers delivering, as the one collection does on every placement (above)."""
    got = train(placement("collaborative"), lambda: new_model(kind=TwoCollections))
    assert got["delivered_batches"] == STEPS
    assert difference(got, reference()) is None, difference(got, reference())


def test_a_model_needs_a_collection_and_a_placed_one():
    cfg = cosparse.load_config(mapping())
    with pytest.raises(ConfigError, match="Linear holds no cosparse.EmbeddingBagCollection"):
        cosparse.Trainer(nn.Linear(3, 1), cfg)
    with pytest.raises(ConfigError, match=r"table 'items' is in the EmbeddingBagCollections "
                                          r"'a' and 'towers\.0'"):
        cosparse.Trainer(_SharedTable(), cfg)
    with pytest.raises(ConfigError, match=r"feature 'C3' is read by the EmbeddingBagCollections "
                                          r"'a' and 'b'"):
        cosparse.Trainer(_SharedFeature(), cfg)
    model = new_model()
    with cosparse.Trainer(model, cfg, log=lambda m: None) as trainer:
        trainer.fit(2)
        batch = trainer._engine.train_reader.build(0)
    from cosparse.nn.types import PreparedBatch

    with pytest.raises(RuntimeError, match="not placed yet: train the model through "
                                           r"cosparse\.Trainer"):
        model(cosparse.Batch(PreparedBatch(batch, {}), torch.device("cpu")))
    with pytest.raises(RuntimeError, match="not placed yet"):
        UserModel().embeddings(cosparse.Batch(PreparedBatch(batch, {}), torch.device("cpu")))


class _Recording(UserModel):
    def forward(self, batch):
        self.seen = getattr(self, "seen", None) or batch
        return super().forward(batch)


def test_the_batch_a_forward_receives_and_evaluate():
    model = _Recording()
    with cosparse.Trainer(model, cosparse.load_config(mapping()), log=lambda m: None) as t:
        t.fit(1)
        scores = t.evaluate()
    assert scores["auc.label"] == scores["auc"] and scores["eval_samples"] == 64
    b = model.seen
    assert b.batch_size == 64 and b.weights is None and list(b.labels) == ["label"]
    assert b.dense.dtype == torch.float32 and b.dense.shape == (64, 3)
    assert b.labels["label"].shape == (64,) and set(b.labels["label"].tolist()) <= {0.0, 1.0}
    kjt = b.sparse
    assert kjt.keys() == ["C1", "C2", "C3", "C4"] and kjt.stride() == 64
    assert kjt.lengths().shape == (4 * 64,) and int(kjt.offsets()[-1]) == kjt.values().shape[0]
    parts = kjt.to_dict()
    assert list(parts) == kjt.keys()
    assert torch.equal(torch.cat([parts[k].values for k in kjt.keys()]), kjt.values())
    c2 = parts["C2"]
    assert torch.equal(c2.lengths, kjt.lengths()[64:128])
    assert torch.equal(c2.values[c2.offsets[5]:c2.offsets[6]],
                       kjt.values()[kjt.offsets()[64 + 5]:kjt.offsets()[64 + 6]])


class _Wide(UserModel):
    def forward(self, batch):
        return super().forward(batch)[:, None].expand(-1, 2)


def test_a_forward_that_returns_the_wrong_shape_is_named():
    torch.manual_seed(0)
    with cosparse.Trainer(_Wide(), cosparse.load_config(mapping()), log=lambda m: None) as t, \
            pytest.raises(ValueError, match=r"returned torch\.float32 \(64, 2\); expected float "
                                            r"logits of shape \(64,\)"):
        t.fit(1)


def test_importing_cosparse_loads_no_torch():
    code = ("import sys, cosparse; assert 'torch' not in sys.modules, 'torch'; "
            "assert cosparse.Jagged.__name__ == 'Jagged'; print(sorted(cosparse.__all__))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Trainer" in out.stdout and "load_config" in out.stdout
