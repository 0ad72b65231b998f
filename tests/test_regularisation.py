"""Regularisation of the dense model (issue 15): ``model.dropout`` in every model kind's towers,
with masks that follow (seed, rank, step) only and are off at eval, and
``model.dense_optimizer.weight_decay`` (adam's decoupled, as AdamW). The sparse rows' L2
(``tables[*].optimizer.l2``) is tested in test_optim.py and test_exactness.py."""

from __future__ import annotations

import pytest
import torch

from cosparse.config import (
    Config,
    DataConfig,
    DenseOptimizerConfig,
    DINConfig,
    ModelConfig,
    SyntheticConfig,
    TableConfig,
    validate,
)
from cosparse.data.reader import make_reader
from cosparse.models.builtin import build_model
from cosparse.nn.dropout import SeededDropout, TowerDropout
from cosparse.train.dense import make_dense_optimizer

FEATS = [f"C{i}" for i in range(1, 5)]


def _cfg(kind: str, dropout: float) -> Config:
    if kind == "din":  # DIN over an unpooled history and its target
        tables = [TableConfig(name="t", dim=8, features=["C1"]),
                  TableConfig(name="h", dim=8, features=["C2"], pooling="none")]
    else:
        tables = [TableConfig(name="t", dim=8, features=FEATS)]
    return validate(Config(
        data=DataConfig(reader="synthetic", batch_size=64, synthetic=SyntheticConfig(
            num_features=4, vocab_size=500, seed=5, bag_min=1, bag_max=3)),
        model=ModelConfig(kind=kind, bottom=[16, 8], top=[16, 1], deep=[16, 8], dropout=dropout,
                          din=DINConfig(pairs=[["C1", "C2"]], attention=[8], mlp=[16, 8])),
        tables=tables,
    ))


def _model(kind: str, dropout: float):
    cfg = _cfg(kind, dropout)
    reader = make_reader(cfg.data, "train")
    torch.manual_seed(0)
    model = build_model(cfg, reader.num_dense, torch.device("cpu"))
    return model, reader.build(next(iter(reader.tasks())))


@pytest.mark.parametrize("kind", ["dlrm", "deepfm", "dcn", "din"])
def test_dropout_is_in_every_kinds_towers_seeded_by_step_and_off_at_eval(kind):
    plain, batch = _model(kind, 0.0)
    model, _ = _model(kind, 0.5)
    assert plain.dropout is None and not any(
        isinstance(m, SeededDropout) for m in plain.modules())
    assert sum(isinstance(m, SeededDropout) for m in model.modules()) >= 1
    # the same parameters under the same keys: a checkpoint resumes with or without dropout
    sd_plain, sd = plain.state_dict(), model.state_dict()
    assert sd_plain.keys() == sd.keys()
    assert all(torch.equal(sd_plain[k], sd[k]) for k in sd)

    def logits(m, step=None, noise=False):
        if step is not None:
            m.dropout.begin_step(step)
        if noise:  # other draws from torch's global generator do not move the masks
            torch.rand(1000)
        with torch.no_grad():
            return m(m.ec.prepare_and_stage(batch))

    model.eval()
    plain.eval()
    assert torch.equal(logits(model), logits(plain))  # eval: no dropout at all
    model.train()
    first = logits(model, step=3)
    assert not torch.equal(first, logits(plain))
    assert torch.equal(logits(model, step=3, noise=True), first)
    assert not torch.equal(logits(model, step=4), first)
    model.dropout.begin_step(3, rank=1)  # another rank: other masks
    assert not torch.equal(logits(model), first)


def test_dropout_keeps_the_expected_fraction_and_scales_the_rest():
    source = TowerDropout(0.25, seed=7)
    layer = SeededDropout(source)
    source.begin_step(1)
    out = layer(torch.ones(200_000))
    kept = out != 0
    assert abs(kept.float().mean().item() - 0.75) < 0.01
    assert torch.allclose(out[kept], torch.full_like(out[kept], 1 / 0.75))
    with pytest.raises(ValueError, match="model.dropout"):
        TowerDropout(1.0, seed=0)


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam"])
def test_dense_weight_decay_shrinks_weights_whose_gradient_is_zero(kind):
    """One step on a zero loss gradient moves a weight only by its decay: sgd and adagrad as
    torch's L2 term (weight_decay * w added to the gradient), adam decoupled (AdamW), so there
    the weight shrinks by exactly lr * weight_decay * w, not by Adam's normalised step."""
    lr, wd = 0.1, 0.5
    w0 = torch.tensor([0.5, -1.0, 2.0])
    moved = {}
    for decay in (0.0, wd):
        cfg = Config(model=ModelConfig(dense_optimizer=DenseOptimizerConfig(
            kind=kind, lr=lr, weight_decay=decay)))  # type: ignore[arg-type]
        p = torch.nn.Parameter(w0.clone())
        opt = make_dense_optimizer(cfg, [p])
        p.grad = torch.zeros_like(p)
        opt.step()
        moved[decay] = p.detach().clone()
    assert torch.equal(moved[0.0], w0)
    got = moved[wd]
    assert (got.abs() < w0.abs()).all() and (got.sign() == w0.sign()).all()
    g = wd * w0
    expect = {"sgd": w0 - lr * g,
              "adagrad": w0 - lr * g / ((g * g).sqrt() + 1e-10),
              "adam": w0 * (1 - lr * wd)}[kind]
    torch.testing.assert_close(got, expect, rtol=1e-6, atol=0)
