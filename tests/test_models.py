"""Model zoo: DLRM, DeepFM and DCN-v2 build from config, run forward/backward and learn."""

import pytest
import torch
import torch.nn.functional as F

from cosparse.config import Config, DataConfig, ModelConfig, SyntheticConfig, TableConfig, validate
from cosparse.data.reader import make_reader
from cosparse.models.builtin import build_model


def _cfg(kind: str) -> Config:
    feats = [f"C{i}" for i in range(1, 9)]
    return validate(Config(
        data=DataConfig(reader="synthetic", batch_size=256,
                        synthetic=SyntheticConfig(num_features=8, vocab_size=2000, seed=3)),
        model=ModelConfig(kind=kind, bottom=[16, 8], top=[16, 1], deep=[16], cross_layers=2,
                          cross_rank=4 if kind == "dcn" else None),
        tables=[TableConfig(name="t", dim=8, features=feats)],
    ))


@pytest.mark.parametrize("kind", ["dlrm", "deepfm", "dcn"])
def test_model_trains_on_synthetic(kind):
    torch.manual_seed(0)
    cfg = _cfg(kind)
    reader = make_reader(cfg.data, "train")
    model = build_model(cfg, reader.num_dense, torch.device("cpu"))
    opt = torch.optim.Adagrad(model.parameters(), lr=0.05)
    losses = []
    for _epoch in range(3):
        for task in list(reader.tasks())[:10]:
            batch = reader.build(task)
            logits = model(model.ec.prepare_and_stage(batch))
            assert logits.shape == (batch.batch_size,)
            loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            model.ec.apply_gradients()
            losses.append(float(loss.detach()))
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < first - 0.01, (kind, first, last)
