"""What a retrieval model's full-corpus ranking is set beside, in the same run and on the same
samples and masks (``cosparse.train.retrieval_eval``):

- **popularity**: each item scored by its count in the training split;
- **transitions**, a baseline that learns no item embedding: each item scored by how often the
  user's most recent item was followed by it in the training split (a first-order Markov
  chain), popularity breaking its ties;
- **sampled candidates** (``objective.tasks.NAME.sampled_eval: n``, off by default): the
  target ranked against ``n`` items drawn uniformly from the corpus (those the user saw before,
  and the target itself, dropped from the draw), as papers that sample report. Its metrics are
  named ``recall@10.sampled{n}`` and so on: they are not comparable with the full corpus's.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

Scores = Callable[[int, int], torch.Tensor]


def shared_ranks(scores: np.ndarray, targets: np.ndarray, seen: tuple[np.ndarray, np.ndarray]
                 ) -> np.ndarray:
    """Each user's 0-based target rank when every user scores the items alike (``scores``
    [N]: popularity), as ``rank_all`` ranks them (ties by corpus index, the user's earlier
    items left out), without a users x items matrix: the target's position in the one order of
    the items, less the user's earlier items before it (each once)."""
    n = scores.shape[0]
    order = np.lexsort((np.arange(n), -scores.astype(np.float64)))
    position = np.empty(n, np.int64)
    position[order] = np.arange(n)
    flat, counts = seen
    user = np.repeat(np.arange(targets.shape[0]), counts)
    pairs = np.unique(user * n + flat)
    u, item = pairs // n, pairs % n
    before = position[item] < position[targets[u]]
    return position[targets] - np.bincount(u[before], minlength=targets.shape[0])


def transition_scores(popularity: np.ndarray, indptr: np.ndarray, indices: np.ndarray,
                      counts: np.ndarray, last: np.ndarray) -> Scores:
    """Users lo..hi's scores: the transitions' count from each user's most recent item
    (``last``, -1: none), then popularity, in float64 (both exact integers)."""
    pop = torch.from_numpy(popularity.astype(np.float64))
    scale = float(popularity.max(initial=0) + 1)

    def scores(lo: int, hi: int) -> torch.Tensor:
        out = pop[None, :].repeat(hi - lo, 1)
        rows = last[lo:hi]
        have = np.flatnonzero(rows >= 0)
        starts, ends = indptr[rows[have]], indptr[rows[have] + 1]
        sizes = ends - starts
        flat = np.repeat(ends - np.cumsum(sizes), sizes) + np.arange(int(sizes.sum()))
        r = torch.from_numpy(np.repeat(have, sizes))
        c = torch.from_numpy(indices[flat])
        out[r, c] += torch.from_numpy(counts[flat].astype(np.float64)) * scale
        return out
    return scores


def sampled_ranks(scores_of: Scores, n_users: int, targets: np.ndarray,
                  seen: tuple[np.ndarray, np.ndarray], candidates: int, seed: int,
                  chunk: int) -> np.ndarray:
    """Each user's 0-based target rank among ``candidates`` items drawn uniformly from the
    corpus (seeded by ``seed``), the user's earlier items and the target dropped from the draw
    (so a user may rank against fewer); ties go against the target."""
    flat, counts = seen
    starts = np.concatenate([[0], np.cumsum(counts)])
    rng = np.random.default_rng([seed, 7])
    out = np.empty(n_users, np.int64)
    for lo in range(0, n_users, chunk):
        hi = min(lo + chunk, n_users)
        scores = scores_of(lo, hi)
        n_items = scores.shape[1]
        drawn = torch.from_numpy(rng.integers(0, n_items, size=(hi - lo, candidates)))
        rows = torch.arange(hi - lo)
        own = torch.from_numpy(targets[lo:hi])
        dropped = torch.zeros(hi - lo, n_items, dtype=torch.bool)
        dropped[torch.from_numpy(np.repeat(np.arange(hi - lo), counts[lo:hi])),
                torch.from_numpy(flat[starts[lo]:starts[hi]])] = True
        dropped[rows, own] = True
        keep = ~torch.gather(dropped, 1, drawn)
        picked = torch.gather(scores, 1, drawn)
        out[lo:hi] = ((picked >= scores[rows, own][:, None]) & keep).sum(1).numpy()
    return out
