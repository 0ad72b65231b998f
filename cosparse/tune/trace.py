"""Replay a config's data into per-table ID traces: the unique dense row IDs of every batch.

Per batch and table, the IDs of all the table's features (one shared ID space), taken modulo
``hash_size`` when it is set, are deduplicated with the engine's ``Deduper`` and mapped to dense
IDs ``0..V-1`` (first-appearance order) with the engine's ``IdMap``: both are numba kernels, so
no Python loop runs per ID.
"""

from __future__ import annotations

import sys

import numpy as np
from tqdm import tqdm

from cosparse.config import Config, ConfigError
from cosparse.data import BatchStream, Reader, make_reader
from cosparse.store.dedup import Deduper
from cosparse.store.hashmap import IdMap
from cosparse.tune.types import Trace


def build_traces(cfg: Config, steps: int, progress: bool = True,
                 reader: Reader | None = None) -> list[Trace]:
    """One Trace per ``cfg.tables`` entry over the first ``steps`` batches of the train split
    (fewer when the data ends first); ``reader``: the run's own (default: ``data.reader``'s)."""
    if steps <= 0:
        raise ConfigError("--steps: must be positive")
    reader = reader or make_reader(cfg.data, "train")
    for i, t in enumerate(cfg.tables):
        for f in t.features:
            if f not in reader.keys:
                raise ConfigError(
                    f"tables[{i}].features: feature '{f}' is not produced by data.reader "
                    f"'{cfg.data.reader}' (it has {', '.join(reader.keys)})"
                )
    dedupers = [Deduper() for _ in cfg.tables]
    maps = [IdMap(expected=t.num_embeddings or 65536) for t in cfg.tables]
    batches: list[list[np.ndarray]] = [[] for _ in cfg.tables]
    total = min(steps, reader.num_batches)
    stream = BatchStream(reader, cfg.data.workers, cfg.data.queue_depth,
                         preload=("cosparse.features.preload",))
    try:
        bar = tqdm(total=total, desc="replay", unit="batch", file=sys.stderr, disable=not progress)
        for n, batch in enumerate(stream):
            if n >= steps:
                break
            for ti, t in enumerate(cfg.tables):
                parts = [batch.feature(f)[0].numpy() for f in t.features]
                ids = parts[0] if len(parts) == 1 else np.concatenate(parts)
                if t.hash_size is not None:
                    ids = np.remainder(ids, t.hash_size)
                unique, _ = dedupers[ti].unique(ids)
                dense, _ = maps[ti].lookup_or_insert(unique)
                batches[ti].append(dense)
            bar.update(1)
        bar.close()
    finally:
        stream.close()
    return [Trace.from_batches(b, m.size, t.name) for b, m, t in zip(batches, maps, cfg.tables,
                                                                     strict=True)]
