"""Multi-task ranking (issue 36, item 1): MMoE, PLE and ESMM as layers (``cosparse.nn.multitask``)
and as models (``model.kind: mmoe | ple | esmm``, ``cosparse.models.<kind>:build``). Their
layers compute what their papers say; each model trains bit-identically on every placement
(``cosparse.check``); the factory in Python trains the numbers of the config's kind; the
objective's tasks are checked against the kind; and each learns its tasks on a log whose
labels follow its features."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from multitask_model import ARGS, BUILD, STEPS, mapping, write_log

import cosparse
from cosparse.api.factory import make_trainer
from cosparse.cli import main
from cosparse.config import ConfigError, config_from_mapping, load_config
from cosparse.data import BatchStream
from cosparse.models import esmm
from cosparse.nn.multitask import CGC, PLE, MMoE, TaskTowers, ctcvr_logit
from cosparse.serving import load
from cosparse.train.evaluate import joined_batches
from tests.torchrun import ROOT, run_ranks


@pytest.fixture(scope="module")
def csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_log(tmp_path_factory.mktemp("mt") / "log.csv")


def test_mmoe_mixes_its_experts_by_each_task_gate() -> None:
    torch.manual_seed(0)
    layer, x = MMoE(6, ["a", "b"], experts=3, layers=[5, 4]), torch.randn(7, 6)
    out = layer(x)
    experts = torch.stack([e(x) for e in layer.experts], dim=1)
    for task in ("a", "b"):
        weights = torch.softmax(layer.gates[task](x), dim=1)
        torch.testing.assert_close(out[task], (weights[:, :, None] * experts).sum(1))
    assert out["a"].shape == (7, 4) and not torch.equal(out["a"], out["b"])


def test_a_cgc_task_gate_sees_only_its_own_and_the_shared_experts() -> None:
    torch.manual_seed(0)
    layer = CGC(6, ["a", "b"], shared=2, specific=1, layers=[4], dropout=None, shared_out=True)
    x = torch.randn(5, 6)
    out, shared = layer({"a": x, "b": x}, x)
    assert layer.gates["a"].out_features == 3 and layer.shared_gate.out_features == 4
    with torch.no_grad():  # b's own expert changes: a's output does not, the shared one does
        layer.own["b"][0][0].weight.add_(1.0)
    again, shared_again = layer({"a": x, "b": x}, x)
    assert torch.equal(again["a"], out["a"]) and not torch.equal(again["b"], out["b"])
    assert not torch.equal(shared_again, shared)
    stacked = PLE(6, ["a", "b"], levels=3, shared=1, specific=2, layers=[8, 4])
    assert [lvl.shared_gate is None for lvl in stacked.levels] == [False, False, True]
    heads = TaskTowers(4, ["a", "b"], [3])(stacked(x))
    assert {k: tuple(v.shape) for k, v in heads.items()} == {"a": (5,), "b": (5,)}


def test_ctcvr_is_the_product_of_the_two_probabilities_and_stays_finite() -> None:
    a = torch.tensor([-3.0, 0.0, 2.0, 40.0, 200.0, -200.0], requires_grad=True)
    b = torch.tensor([1.0, 0.5, -1.0, 40.0, 200.0, 3.0], requires_grad=True)
    z = ctcvr_logit(a, b)
    want = torch.sigmoid(a[:3]) * torch.sigmoid(b[:3])
    torch.testing.assert_close(torch.sigmoid(z[:3]), want)
    assert torch.isfinite(z).all() and z[3] > 15 and z[5] < -190
    loss = torch.nn.functional.binary_cross_entropy_with_logits(z, torch.ones(6))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(a.grad).all() and torch.isfinite(b.grad).all()


@pytest.mark.parametrize("kind", sorted(BUILD))
def test_the_kind_trains_bit_identically_on_every_placement(csv: Path, kind: str) -> None:
    result = cosparse.check(None, mapping(csv, kind), steps=STEPS, log=lambda m: None)
    assert result.ok, result.table()


@pytest.mark.parametrize("kind", sorted(BUILD))
def test_the_factory_in_python_trains_the_numbers_of_the_kind(csv: Path, kind: str) -> None:
    cfg = config_from_mapping(mapping(csv, kind))
    trainer = make_trainer(cfg, log=lambda m: None)
    try:
        trainer.run(evaluate=False)
        by_kind = list(trainer.losses)
    finally:
        trainer.close()
    raw = mapping(csv, None)
    torch.manual_seed(cosparse.load_config(raw).train.seed)
    model = BUILD[kind](raw.pop("tables"), 1, **ARGS[kind])
    with cosparse.Trainer(model, raw, log=lambda m: None) as py:
        result = py.fit()
    assert len(by_kind) == STEPS and result.losses == by_kind
    assert {"auc.click", "auc.buy"} <= set(result.metrics)


def test_the_kinds_learn_their_tasks(csv: Path) -> None:
    """Ten epochs of each: every task's eval AUC above chance."""
    for kind in sorted(BUILD):
        raw = mapping(csv, None, steps=120)
        raw["train"].update(epochs=10)
        raw["model"]["dense_optimizer"]["lr"] = 0.02
        torch.manual_seed(0)
        with cosparse.Trainer(BUILD[kind](raw.pop("tables"), 1, **ARGS[kind]), raw,
                              log=lambda m: None) as trainer:
            metrics = trainer.fit().metrics
        assert metrics["auc.click"] > 0.6 and metrics["auc.buy"] > 0.6, (kind, metrics)


def test_the_objective_and_the_kind_must_agree(csv: Path) -> None:
    three = mapping(csv, "esmm")
    three["data"]["columns"]["labels"].update(click={"column": "click", "threshold": 0.5},
                                              d={"column": "click", "threshold": 0.9})
    three["objective"]["tasks"]["d"] = {"kind": "binary"}
    with pytest.raises(ConfigError, match=r"model\.multitask\.tasks: ESMM trains two binary"):
        config_from_mapping(three)
    regression = mapping(csv, "esmm")
    regression["objective"]["tasks"]["buy"] = {"kind": "regression"}
    with pytest.raises(ConfigError, match=r"objective\.tasks\.buy\.kind: ESMM's tasks are binary"):
        config_from_mapping(regression)
    named = mapping(csv, "mmoe")
    named["model"]["multitask"]["tasks"] = ["click", "buy"]
    with pytest.raises(ConfigError, match=r"model\.multitask\.tasks: names ESMM's"):
        config_from_mapping(named)
    few = mapping(csv, "ple")
    few["model"]["multitask"]["specific"] = 0
    with pytest.raises(ConfigError, match=r"multitask\.specific: must be in \[1, 1000\] \(got 0"):
        config_from_mapping(few)
    none = mapping(csv, "mmoe")
    none["model"]["multitask"]["experts"] = 0
    with pytest.raises(ConfigError, match=r"model\.multitask\.experts: MMoE mixes one expert"):
        config_from_mapping(none)
    single = mapping(csv, "mmoe")
    single["model"]["kind"] = "dlrm"
    del single["model"]["multitask"]
    with pytest.raises(ConfigError, match=r"model\.kind 'dlrm' trains one task.*mmoe, ple"):
        config_from_mapping(single)
    with pytest.raises(ConfigError, match=r"model\.args\.tasks: ESMM trains two binary"):
        esmm.build(mapping(csv, None)["tables"], 1, tasks=["click"])


def test_two_ranks_train_each_kind_as_one_process_does(csv: Path, tmp_path: Path) -> None:
    """Each kind from its config on 2 ranks (DDP over the dense layers, the table row-wise),
    each rank's summed loss over the global batch: the losses, AUCs and dense weights match one
    process within float tolerance (sums in another order)."""
    out = tmp_path / "rank0.pt"
    log = run_ranks(ROOT / "tests/multitask_ranks.py", [str(csv), str(out)], 180)
    got = torch.load(out)
    for kind in sorted(BUILD):
        trainer = make_trainer(config_from_mapping(mapping(csv, kind)), log=lambda m: None)
        try:
            final = trainer.run()
            losses, dense = list(trainer.losses), trainer.model.state_dict()
        finally:
            trainer.close()
        np.testing.assert_allclose(got[kind]["losses"], losses, rtol=1e-5, err_msg=log[-2000:])
        for key in ("auc.click", "auc.buy"):
            assert got[kind]["metrics"][key] == pytest.approx(final[key], rel=1e-4), (kind, key)
        for k, v in dense.items():
            torch.testing.assert_close(got[kind]["dense"][k], v, rtol=1e-5, atol=1e-6)


TAOBAO = ROOT.parent / "shared/data/taobao-userbehavior/UserBehavior_head84k.csv"


@pytest.mark.skipif(not TAOBAO.exists(), reason=f"{TAOBAO} is absent")
@pytest.mark.parametrize("name", ["taobao_mmoe", "taobao_esmm"])
def test_the_taobao_configs_train_every_task_from_config_alone(name: str) -> None:
    """``configs/taobao_mmoe.yaml`` (click, cart or favourite, buy) and ``taobao_esmm.yaml``
    (engage as the click, buy as the conversion), one epoch: every task's eval AUC well above
    chance (0.68-0.70 here)."""
    cfg = load_config(ROOT / f"configs/{name}.yaml", {"data.path": str(TAOBAO)})
    trainer = make_trainer(cfg, log=lambda m: None)
    try:
        final = trainer.run()
    finally:
        trainer.close()
    aucs = {k: v for k, v in final.items() if k.startswith("auc.")}
    assert len(aucs) == len(cfg.objective.tasks) and min(aucs.values()) > 0.62, aucs


@pytest.mark.parametrize("kind", ["mmoe", "esmm"])
def test_the_export_serves_each_task_as_evaluation_scored_it(csv: Path, tmp_path: Path,
                                                              kind: str) -> None:
    raw = mapping(csv, kind)
    raw["train"]["checkpoint"] = {"dir": str(tmp_path / "ck"), "every": STEPS}
    trainer = make_trainer(config_from_mapping(raw), log=lambda m: None)
    try:
        trainer.run()
        predictions = {k: v.copy() for k, v in trainer.eval_predictions.items()}
        with BatchStream(trainer.eval_reader, 0, 2) as stream:
            batches = list(joined_batches(stream, 1024))
    finally:
        trainer.close()
    assert main(["export", "--checkpoint", str(tmp_path / "ck"), "--out", str(tmp_path / "ex"),
                 "--format", "npy"]) == 0
    served = load(tmp_path / "ex")
    got = [served.predict(b) for b in batches]
    assert sorted(predictions) == ["buy", "click"]
    for task, want in predictions.items():
        joined = np.concatenate([g[task].numpy() for g in got])
        assert np.array_equal(joined.view(np.uint32), want.view(np.uint32)), task
