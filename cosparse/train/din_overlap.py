"""DIN's sanity check on the data: how often a sample's target occurs in its own history.

DIN attends from the target to the history; when no target ever appears in its history (the two
columns hashed into different ID spaces, say), the attention cannot match anything and the model
trains without a word. ``warn_din_without_overlap`` reads the first batches and warns, naming the
pair and the fix (``data.columns.id_space``), when a pair's target never occurs in its history.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from cosparse.batch import SparseBatch
from cosparse.config import Config
from cosparse.data.reader import NOT_YET

CHECKED_BATCHES = 4  # the first batches read for the check (fewer once every pair matched)


def target_in_history(batch: SparseBatch, target: str, history: str) -> tuple[int, int]:
    """(samples whose one target ID occurs in their history, samples with one target ID and a
    non-empty history) of one batch."""
    t_ids, t_len = (x.numpy() for x in batch.feature(target))
    h_ids, h_len = (x.numpy() for x in batch.feature(history))
    t_first = np.concatenate([[0], np.cumsum(t_len)[:-1]]).astype(np.int64)
    one = (t_len == 1) & (h_len > 0)
    target_of = np.zeros(len(t_len), t_ids.dtype)
    single = np.flatnonzero(t_len == 1)
    target_of[single] = t_ids[t_first[single]]
    owner = np.repeat(np.arange(len(h_len)), h_len)  # the sample of each history element
    hit = np.zeros(len(h_len), bool)
    if len(owner):
        hit[owner[h_ids == target_of[owner]]] = True
    return int((hit & one).sum()), int(one.sum())


def din_overlap(cfg: Config, reader: Any, batches: int = CHECKED_BATCHES
                ) -> dict[tuple[str, str], tuple[int, int]]:
    """Each ``model.din.pairs`` pair's (samples with the target in their history, samples
    checked) over the reader's first ``batches`` batches."""
    pairs = [(str(p[0]), str(p[1])) for p in cfg.model.din.pairs]
    counts = {p: (0, 0) for p in pairs}
    tasks = reader.tasks()
    try:
        ready = itertools.takewhile(lambda t: t is not NOT_YET, tasks)
        for task in itertools.islice(ready, batches):
            batch = reader.build(task)
            for p in pairs:
                hits, seen = target_in_history(batch, *p)
                counts[p] = (counts[p][0] + hits, counts[p][1] + seen)
            if all(h > 0 for h, _ in counts.values()):
                break
    finally:
        if hasattr(tasks, "close"):
            tasks.close()
    return counts


def warn_din_without_overlap(cfg: Config, reader: Any, log: Callable[[str], None]) -> None:
    """Warn for each DIN pair whose target never occurs in its history over the first
    batches (a model other than DIN: nothing to check)."""
    if cfg.model.kind != "din":
        return
    for (target, history), (hits, seen) in din_overlap(cfg, reader).items():
        if seen and not hits:
            log(f"warning: model.din.pairs [{target}, {history}]: in {seen} samples of the first "
                f"batches the target never occurs in its history, so the attention matches "
                f"nothing; if both columns name one entity, give them one ID space "
                f"(data.columns.id_space: {{{target}: [{history}]}})")
