"""bench_quality's retrieval family, cosparse's side: the two-tower model of
``configs/movielens_two_tower.yaml`` on MovieLens-100k (leave-last-out, the whole corpus ranked,
each user's earlier items left out), trained per seed and on the tiered and collaborative
placements; and the same samples, eval users, corpus and left-out items written as arrays for
the torch-rechub peer (``benchmarks/peer_rechub.py --family retrieval``), each table's IDs
renumbered 1..n (0 pads).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml

from benchmarks.common import REPO
from benchmarks.quality_multitask import padded, placements_equal, train

CONFIG = REPO / "configs/movielens_two_tower.yaml"
MOVIELENS = REPO.parent / "shared/data/movielens-100k/u.data"
PAD = np.iinfo(np.int64).min  # (no ID of a hashed column is this one)
__all__ = ["CONFIG", "MOVIELENS", "epoch_steps", "export_samples", "mapping",
           "placements_equal", "train"]


def mapping(steps: int | None, seed: int) -> dict[str, Any]:
    """The config as a mapping: MovieLens-100k, ``steps`` steps (None: the config's epochs),
    the model's initial weights drawn from ``seed``."""
    raw = yaml.safe_load(CONFIG.read_text())
    raw["data"]["path"] = str(MOVIELENS)
    raw["train"].update(seed=seed, log_every=10**6, progress=False)
    if steps is not None:
        raw["train"].update(steps=steps, epochs=None)
    return raw


def epoch_steps() -> int:
    """The steps of the config's run (its epochs of the training split's batches)."""
    from cosparse.config import config_from_mapping
    from cosparse.train.inputs import model_inputs

    cfg = config_from_mapping(mapping(None, 0))
    return model_inputs(cfg).train.num_batches * int(cfg.train.epochs or 1)


def export_samples(raw: dict[str, Any], path: Path, max_train: int | None = None
                   ) -> dict[str, int]:
    """The run's training samples (one epoch, in its order; the first ``max_train`` of them
    when given), the eval users, the corpus, each
    eval user's target (a corpus index) and left-out items, and each corpus item's training
    count, as arrays in ``path`` (an .npz); returns each table's vocabulary size."""
    from cosparse.config import config_from_mapping
    from cosparse.data.item_corpus import item_corpus, ranking_inputs
    from cosparse.train.inputs import model_inputs

    cfg = config_from_mapping(raw)
    inputs = model_inputs(cfg)
    max_len = cfg.data.events.max_len
    arrays: dict[str, np.ndarray] = {}
    for split, reader in (("train", inputs.train), ("eval", inputs.eval)):
        parts: dict[str, list[np.ndarray]] = {"user": [], "item": [], "hist_item": []}
        for task in reader.tasks():
            batch = reader.build(task)
            for key in parts:
                ids, lengths = (t.numpy() for t in batch.feature(key))
                parts[key].append(padded(ids, lengths, max_len, PAD) if key == "hist_item"
                                  else ids)
        limit = max_train if split == "train" else None
        arrays.update({f"{split}.{k}": np.concatenate(v)[:limit] for k, v in parts.items()})
    corpus, _ = item_corpus(inputs.eval, 4096)
    targets, (seen, counts), popularity = ranking_inputs(inputs.eval, corpus)
    arrays.update({"corpus": corpus, "eval.target": targets, "eval.seen": seen,
                   "eval.seen_counts": counts, "popularity": popularity})
    vocab = {}
    for table, keys in (("user", ["train.user", "eval.user"]),
                        ("item", ["train.item", "eval.item", "train.hist_item",
                                  "eval.hist_item", "corpus"])):
        known = np.unique(np.concatenate([arrays[k][arrays[k] != PAD].ravel() for k in keys]))
        for k in keys:  # 1..n by ID; padding becomes 0
            a = arrays[k]
            arrays[k] = np.where(a != PAD, np.searchsorted(known, a) + 1, 0).astype(np.int64)
        vocab[table] = int(known.shape[0]) + 1
    np.savez(path, **arrays)
    return vocab

