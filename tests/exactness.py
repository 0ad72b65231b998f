"""Shared machinery of the exactness matrix: configs, runs, and the bit-for-bit comparison."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cosparse.config import (
    CheckpointConfig,
    Config,
    DataConfig,
    ModelConfig,
    OptimizerConfig,
    SyntheticConfig,
    TableConfig,
    TrainConfig,
    validate,
)
from cosparse.train import placements
from cosparse.train.exactness import first_difference
from cosparse.train.placements import collaborative, ps_direct, tiered
from cosparse.train.trainer import Trainer

__all__ = ["CRITEO", "STEPS", "base_config", "collaborative", "first_difference", "ps_direct",
           "run", "tiered", "trace_stats"]

CRITEO = Path(__file__).resolve().parents[2] / "shared/data/criteo/train_head10k.txt"
STEPS = 150


def base_config(dataset: str, optimizer: str) -> Config:
    opt = OptimizerConfig(kind=optimizer, lr=0.05 if optimizer != "adam" else 0.01)
    if dataset == "criteo":
        data = DataConfig(reader="criteo_tsv", path=str(CRITEO), batch_size=256, eval_fraction=0.2)
        feats = [f"C{i}" for i in range(1, 27)]
    else:
        data = DataConfig(reader="synthetic", batch_size=256, synthetic=SyntheticConfig(
            num_features=8, vocab_size=20_000, alpha=1.05, bag_min=1, bag_max=4, seed=11,
            num_batches=STEPS, eval_batches=2))
        feats = [f"C{i}" for i in range(1, 9)]
    half = len(feats) // 2
    tables = [
        TableConfig(name="lo", dim=8, features=feats[:half], optimizer=copy.deepcopy(opt)),
        TableConfig(name="hi", dim=8, features=feats[half:], pooling="mean",
                    optimizer=copy.deepcopy(opt), seed=3),
    ]
    return Config(
        data=data,
        model=ModelConfig(kind="dlrm", bottom=[16, 8], top=[16, 1]),
        tables=tables,
        train=TrainConfig(steps=STEPS, epochs=100, progress=False, log_every=STEPS, threads=2),
    )


def trace_stats(cfg: Config, lookahead: int) -> dict[str, tuple[int, int]]:
    """Per table: (rows touched in the run, the most unique rows of lookahead+1 consecutive
    batches)."""
    return placements.trace_stats(cfg, lookahead, STEPS)


@dataclass
class RunResult:
    losses: list[float]
    rows: dict[str, tuple[np.ndarray, np.ndarray]]  # table -> (sorted ids, rows incl. state)
    dense: dict[str, torch.Tensor]
    trainer: Trainer
    trainer_pids: list[int]  # PS shard processes the trainer started (empty without a PS)


def run(cfg: Config, resume_at: int | None = None, ckpt_dir: Path | None = None) -> RunResult:
    cfg = validate(copy.deepcopy(cfg))
    if resume_at is None:
        t = Trainer(cfg, log=lambda m: None)
        t.run()
        losses = t.losses
    else:
        assert ckpt_dir is not None
        cfg.train.checkpoint = CheckpointConfig(dir=str(ckpt_dir), every=resume_at)
        first = Trainer(cfg, log=lambda m: None)
        first.run(steps=resume_at)
        first.close()
        cfg.train.checkpoint = CheckpointConfig()
        t = Trainer(cfg, log=lambda m: None)
        t.resume(str(ckpt_dir))
        t.run()
        losses = first.losses + t.losses
    pids = list(getattr(t.path, "shard_pids", []))
    rows = {}
    for name, state in t.ec.export_rows().items():
        order = np.argsort(state["ids"])
        rows[name] = (state["ids"][order], state["rows"][order])
    t.close()  # after the export: a PS-served run's rows live in its shard processes
    return RunResult(losses, rows, {k: v.clone() for k, v in t.model.state_dict().items()}, t, pids)
