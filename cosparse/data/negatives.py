"""Sampled negatives for implicit feedback (``data.negatives``).

For each positive sample (an event of user u at time t), ``per_positive`` items u had not
interacted with at or before t, drawn uniformly from the log's items or by their popularity among
the training events. Draws are whole-array: every round redraws the rejected candidates at once,
so a user's own items cost nothing per ID in Python. The draws are seeded by ``[seed, split]``;
candidates still rejected after the last round are left out and counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cosparse.config import NegativesConfig

ROUNDS = 64


@dataclass(frozen=True)
class Negatives:
    """The sampled negatives: the event each belongs to (its user, time and history), its item
    and the negatives that no round could draw."""

    event: np.ndarray
    item: np.ndarray
    undrawn: int


def _first_times(user: np.ndarray, item: np.ndarray, time: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(sorted keys of every (user, item) pair, the first time of each)."""
    key = _pair_key(user, item)
    order = np.lexsort((time, key))
    k = key[order]
    first = np.ones(len(k), np.bool_)
    first[1:] = k[1:] != k[:-1]
    return k[first], time[order][first]


def _pair_key(user: np.ndarray, item: np.ndarray) -> np.ndarray:
    """A 64-bit key of (user, item) hashed IDs (a collision only wastes one candidate)."""
    return (user * np.int64(0x9E3779B97F4A7C15 - 2**64)) ^ item


def sample_negatives(user: np.ndarray, item: np.ndarray, time: np.ndarray, positives: np.ndarray,
                     counts_from: np.ndarray, cfg: NegativesConfig, salt: int) -> Negatives:
    """Negatives of the events ``positives`` (indices into the log's arrays). ``counts_from``:
    the events whose items are the catalogue's weights (popularity) and vocabulary."""
    vocab, counts = np.unique(item[counts_from], return_counts=True)
    if cfg.sample_from == "uniform":
        vocab = np.unique(item)
        p = None
    else:
        p = counts / counts.sum()
    keys, first = _first_times(user, item, time)
    event = np.repeat(positives, cfg.per_positive)
    rng = np.random.default_rng([cfg.seed, salt])
    out = np.empty(len(event), np.int64)
    todo = np.arange(len(event))
    for _ in range(ROUNDS):
        if len(todo) == 0:
            break
        cand = vocab[rng.choice(len(vocab), size=len(todo), p=p)]
        e = event[todo]
        k = _pair_key(user[e], cand)
        at = np.minimum(np.searchsorted(keys, k), len(keys) - 1)
        seen = (keys[at] == k) & (first[at] <= time[e])
        out[todo] = cand
        todo = todo[seen]
    keep = np.ones(len(event), np.bool_)
    keep[todo] = False
    return Negatives(event[keep], out[keep], int(len(todo)))
