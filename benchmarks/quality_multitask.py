"""bench_quality's multi-task family, cosparse's side: MMoE from ``configs/taobao_mmoe.yaml`` on
the Taobao UserBehavior log (one sample per event, tasks click / cart_fav / buy, the last 20% of
events by time evaluating), trained per seed, one task at a time (the same towers), and on the
tiered and collaborative placements; and the same samples written as padded arrays for the
torch-rechub peer (``benchmarks/peer_rechub.py``), each table's IDs renumbered 1..n (0 pads).
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from benchmarks.common import REPO

CONFIG = REPO / "configs/taobao_mmoe.yaml"
DIM = 16
TAOBAO = REPO.parent / "shared/data/taobao-userbehavior/UserBehavior_head84k.csv"
# the peer's features: name -> (table, a sequence?); target and history of a kind share a table
FEATURES = {"target_item": ("item", False), "hist_item": ("item", True),
            "target_cate": ("cate", False), "hist_cate": ("cate", True),
            "user": ("user", False), "hist_btag": ("btag", True)}


def mapping(steps: int | None, seed: int) -> dict[str, Any]:
    """The config as a mapping: the Taobao log, ``steps`` steps of one epoch (None: the whole
    epoch), the model's initial weights drawn from ``seed``, every table of dim ``DIM``."""
    raw = yaml.safe_load(CONFIG.read_text())
    raw["data"]["path"] = str(TAOBAO)
    raw["train"].update(steps=steps, epochs=1, seed=seed, log_every=10**6, progress=False)
    for table in raw["tables"]:  # one dim, as torch-rechub's embedding layer needs
        table["dim"] = DIM
    return raw


def epoch_steps() -> int:
    """The steps of one epoch of the log (its training split's batches)."""
    from cosparse.config import config_from_mapping
    from cosparse.train.inputs import model_inputs

    return model_inputs(config_from_mapping(mapping(None, 0))).train.num_batches


def one_task(raw: dict[str, Any], task: str) -> dict[str, Any]:
    """The same model trained on ``task`` alone (its experts, one gate and one tower)."""
    raw = copy.deepcopy(raw)
    raw["data"]["columns"]["labels"] = {task: raw["data"]["columns"]["labels"][task]}
    raw["objective"]["tasks"] = {task: raw["objective"]["tasks"][task]}
    return raw


def train(cfg: Any) -> dict[str, Any]:
    """One run of ``cfg`` (a mapping or a ``Config``): each task's eval AUC (a retrieval task:
    its ranking metrics), the losses and the trainer's training samples/s."""
    from cosparse.api.factory import make_trainer
    from cosparse.config import Config, config_from_mapping

    cfg = cfg if isinstance(cfg, Config) else config_from_mapping(cfg)
    t0 = time.perf_counter()
    trainer = make_trainer(cfg, log=lambda m: None)
    try:
        final = trainer.run()
        losses = list(trainer.losses)
    finally:
        trainer.close()
    ranking = ("recall@10", "ndcg@10", "mrr", "recall@10.popularity", "ndcg@10.popularity",
               "mrr.popularity", "recall@10.transitions", "ndcg@10.transitions")
    return {"auc": {k.split(".", 1)[1]: v for k, v in final.items() if k.startswith("auc.")},
            "ranking": {k: final[k] for k in ranking if k in final},
            "losses": losses, "samples_per_s": final["samples_per_s"],
            "wall_s": round(time.perf_counter() - t0, 1)}


def placements_equal(raw: dict[str, Any], names: tuple[str, ...], steps: int | None = None
                     ) -> dict[str, bool]:
    """Whether each placement of ``names`` trains the resident run's losses and metrics bit
    for bit (``cosparse.train.placements``, as ``cosparse check`` places the config)."""
    from cosparse.config import config_from_mapping
    from cosparse.train.placements import placement_configs

    cfg = config_from_mapping(raw)
    configs = placement_configs(cfg, cfg.train.steps or steps or epoch_steps())
    ref = train(configs["resident"])
    out = {}
    for name in names:
        got = train(configs[name])
        out[name] = all(got[k] == ref[k] for k in ("losses", "auc", "ranking"))
    return out


def export_samples(raw: dict[str, Any], path: Path) -> dict[str, int]:
    """The run's train batches (its ``steps``) and every eval sample, as padded arrays in
    ``path`` (an .npz): per feature [N] or [N, max_len] IDs renumbered per table (0 pads),
    ``<split>.labels`` [N, tasks] and ``tasks``; returns each table's vocabulary size."""
    from cosparse.config import config_from_mapping
    from cosparse.train.inputs import model_inputs

    cfg = config_from_mapping(raw)
    inputs = model_inputs(cfg)
    tasks = list(cfg.objective.tasks)  # type: ignore[union-attr]
    max_len = cfg.data.events.max_len
    parts: dict[str, dict[str, list[np.ndarray]]] = {"train": {}, "eval": {}}
    for split, reader in (("train", inputs.train), ("eval", inputs.eval)):
        for i, task in enumerate(reader.tasks()):
            if split == "train" and cfg.train.steps is not None and i >= cfg.train.steps:
                break
            batch = reader.build(task)
            for name, (_, seq) in FEATURES.items():
                ids, lengths = (t.numpy() for t in batch.feature(name))
                parts[split].setdefault(name, []).append(_padded(ids, lengths, max_len, seq))
            labels = np.stack([batch.task_labels[t].numpy() for t in tasks], axis=1)
            parts[split].setdefault("labels", []).append(labels.astype(np.float32))
    arrays = {f"{s}.{k}": np.concatenate(v) for s, p in parts.items() for k, v in p.items()}
    vocab = {}
    for table in sorted({t for t, _ in FEATURES.values()}):
        keys = [f"{s}.{f}" for s in parts for f, (t, _) in FEATURES.items() if t == table]
        known = np.unique(np.concatenate([arrays[k][arrays[k] >= 0] for k in keys]))
        for k in keys:  # 1..n by raw ID; padding (-1) becomes 0
            a = arrays[k]
            arrays[k] = np.where(a >= 0, np.searchsorted(known, a) + 1, 0).astype(np.int64)
        vocab[table] = int(known.shape[0]) + 1
    np.savez(path, tasks=np.array(tasks), **arrays)
    return vocab


def _padded(ids: np.ndarray, lengths: np.ndarray, max_len: int, seq: bool) -> np.ndarray:
    """[B] for a feature of one ID per sample, else [B, max_len] with -1 after each bag."""
    if not seq:
        assert (lengths == 1).all(), "a single-ID feature with a bag of another length"
        return ids.astype(np.int64)
    return padded(ids, lengths, max_len, -1)


def padded(ids: np.ndarray, lengths: np.ndarray, max_len: int, pad: int) -> np.ndarray:
    """[B, max_len]: each sample's bag of ``ids`` (``lengths``), then ``pad``."""
    out = np.full((lengths.shape[0], max_len), pad, dtype=np.int64)
    rows = np.repeat(np.arange(lengths.shape[0]), lengths)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    out[rows, np.arange(ids.shape[0]) - starts] = ids
    return out
