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
    HostTierConfig,
    ModelConfig,
    OptimizerConfig,
    StoreConfig,
    SupplyConfig,
    SyntheticConfig,
    TableConfig,
    TierConfig,
    TrainConfig,
    validate,
)
from cosparse.data import make_reader
from cosparse.store.dedup import Deduper
from cosparse.train.trainer import Trainer

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
    batches), replayed from the reader exactly as training will see it."""
    reader = make_reader(cfg.data, "train")
    dedup = Deduper()
    per_batch: dict[str, list[np.ndarray]] = {t.name: [] for t in cfg.tables}
    steps = 0
    while steps < STEPS:
        for task in reader.tasks():
            b = reader.build(task)
            for t in cfg.tables:
                ids = np.concatenate([b.feature(f)[0].numpy() for f in t.features])
                per_batch[t.name].append(dedup.unique(ids)[0])
            steps += 1
            if steps == STEPS:
                break
    out = {}
    for name, batches in per_batch.items():
        touched = np.unique(np.concatenate(batches)).shape[0]
        window = max(
            np.unique(np.concatenate(batches[i : i + lookahead + 1])).shape[0]
            for i in range(len(batches))
        )
        out[name] = (touched, window)
    return out


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


def first_difference(got: RunResult, ref: RunResult) -> str | None:
    """None when bit-identical; otherwise where the first difference is."""
    if len(got.losses) != len(ref.losses):
        return f"{len(got.losses)} steps ran, the reference ran {len(ref.losses)}"
    for i, (a, b) in enumerate(zip(got.losses, ref.losses, strict=True)):
        if not torch.equal(torch.tensor(a), torch.tensor(b)):
            return f"loss differs first at step {i + 1}: {a!r} vs {b!r}"
    for name, (ids, rows) in ref.rows.items():
        gids, grows = got.rows[name]
        if not torch.equal(torch.from_numpy(gids), torch.from_numpy(ids)):
            return f"table '{name}': different row IDs ({gids.shape[0]} vs {ids.shape[0]})"
        if not torch.equal(torch.from_numpy(grows), torch.from_numpy(rows)):
            bad = np.flatnonzero((grows != rows).any(axis=1))
            return f"table '{name}': {bad.shape[0]} rows differ, first ID {ids[bad[0]]}"
    for k, v in ref.dense.items():
        if not torch.equal(got.dense[k], v):
            return f"dense parameter '{k}' differs"
    return None


def tiered(cfg: Config, device_rows: int, lookahead: int, workers: int, policy: str,
           host_rows: int | None = None, horizon: int = 0, spill_to: str = "memory") -> Config:
    from cosparse.config import RemoteConfig

    cfg = copy.deepcopy(cfg)
    cfg.store = StoreConfig(
        device=TierConfig(rows=device_rows, policy=policy),
        host=HostTierConfig(rows=host_rows, spill=host_rows is not None, spill_to=spill_to),
        remote=RemoteConfig(embedded=True, num_shards=2),
    )
    cfg.supply = SupplyConfig(path="ps-tiered" if spill_to == "remote" else "resident",
                              lookahead=lookahead, horizon=horizon)
    cfg.data.workers = workers
    return cfg


def ps_direct(cfg: Config, num_shards: int, lookahead: int, cache_rows: int | None = None,
              policy: str = "hotness") -> Config:
    """Architecture A: every row on ``num_shards`` embedded PS shard processes, optionally with a
    write-through device cache of ``cache_rows`` rows per table."""
    from cosparse.config import RemoteConfig

    cfg = copy.deepcopy(cfg)
    cfg.store = StoreConfig(remote=RemoteConfig(embedded=True, num_shards=num_shards),
                            device=TierConfig(rows=cache_rows, policy=policy))
    cfg.supply = SupplyConfig(path="ps-direct", lookahead=lookahead)
    return cfg


def collaborative(cfg: Config, device_rows: int, host_rows: int, lookahead: int, workers: int,
                  num_shards: int = 2, fallback: str | None = None) -> Config:
    """Architecture B: device and host tiers over ``num_shards`` embedded PS shards, with the data
    workers delivering the rows the resident filter does not hold."""
    from cosparse.config import RemoteConfig

    cfg = copy.deepcopy(cfg)
    cfg.store = StoreConfig(
        device=TierConfig(rows=device_rows, policy="hotness"),
        host=HostTierConfig(rows=host_rows, spill=True, spill_to="remote"),
        remote=RemoteConfig(embedded=True, num_shards=num_shards),
    )
    cfg.supply = SupplyConfig(path="collaborative", lookahead=lookahead, fallback=fallback)
    cfg.data.workers = workers
    return cfg
