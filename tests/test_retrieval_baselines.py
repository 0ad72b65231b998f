"""The baselines a retrieval model's ranking is set beside (issue 36, item 2): transitions (the
user's most recent item's next items in the training split, popularity breaking ties; no item
embedding) and the sampled-candidate metrics, named apart from the full corpus's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cosparse.config import ConfigError, config_from_mapping
from cosparse.data.interactions import InteractionLog, InteractionsReader
from cosparse.data.item_corpus import ranking_inputs, transitions
from cosparse.train.retrieval_baselines import sampled_ranks, shared_ranks, transition_scores
from cosparse.train.retrieval_eval import rank_all
from tests.test_two_tower import mapping


def _reader() -> InteractionsReader:
    """Three users; each one's last event is its eval target (leave-last-out):
    u0: 10 20 30 | 20, u1: 10 20 | 40, u2: 30 10 | 20."""
    user = np.array([0, 0, 0, 0, 1, 1, 1, 2, 2, 2])
    item = np.array([10, 20, 30, 20, 10, 20, 40, 30, 10, 20])
    t = np.arange(10, dtype=np.int64)
    log = InteractionLog(user, item, t, t.copy(), None)
    cfg = config_from_mapping({
        "data": {"reader": "interactions", "path": "x.csv", "split": {"by": "last_per_user"},
                 "batch_size": 4, "events": {"min_history": 1},
                 "columns": {"user": "u", "item": "i", "time": "t"}},
        "model": {"kind": "two_tower"}, "tables": [{"name": "t", "dim": 4,
                                                     "features": ["user", "item"]}]})
    return InteractionsReader(log, cfg.data, "eval")


def test_transitions_score_the_most_recent_items_next_items_then_popularity():
    reader = _reader()
    corpus = np.unique(reader.log.item)  # 10 20 30 40
    indptr, indices, counts, last = transitions(reader, corpus)
    # training transitions: 10->20 (u0, u1), 20->30 (u0), 30->10 (u2)
    pairs = {(int(r), int(c)): int(n) for r in range(4)
             for c, n in zip(indices[indptr[r]:indptr[r + 1]], counts[indptr[r]:indptr[r + 1]],
                             strict=True)}
    assert pairs == {(0, 1): 2, (1, 2): 1, (2, 0): 1}
    assert last.tolist() == [2, 1, 0]  # (u0's last before its target: 30; u1: 20; u2: 10)
    targets, seen, popularity = ranking_inputs(reader, corpus)
    assert popularity.tolist() == [3, 2, 2, 0]
    scores = transition_scores(popularity, indptr, indices, counts, last)(0, 3)
    assert scores[2].tolist() == [3.0, 2 + 2 * 4.0, 2.0, 0.0]  # (u2 after 10: 20 twice)
    ranks = rank_all(transition_scores(popularity, indptr, indices, counts, last), 3, targets,
                     seen)
    # u0 after 30: 10, which it saw (left out); u1 after 20: 30 above its target 40
    assert ranks.tolist() == [0, 1, 0]


def test_shared_scores_rank_as_the_users_by_items_matrix_does():
    """Popularity's ranks from one order of the items equal ``rank_all``'s over the matrix:
    ties by corpus index, earlier items left out (duplicates once), the target never."""
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, size=40).astype(np.float64)  # (many ties)
    targets = rng.integers(0, 40, size=30)
    counts = rng.integers(0, 8, size=30)
    flat = rng.integers(0, 40, size=int(counts.sum()))  # (duplicates, and some targets)
    dense = torch.from_numpy(scores)[None, :]
    want = rank_all(lambda lo, hi: dense.expand(hi - lo, -1), 30, targets, (flat, counts))
    assert shared_ranks(scores, targets, (flat, counts)).tolist() == want.tolist()


def test_sampled_candidates_drop_seen_items_and_the_target_and_count_ties_against_it():
    scores = torch.tensor([[0.5, 0.9, 0.5, 0.1, 0.2]])
    seen = (np.array([1]), np.array([1]))  # (item 1, scoring above, was seen: never drawn)
    ranks = sampled_ranks(lambda lo, hi: scores[lo:hi], 1, np.array([0]), seen, 400, 0, 8)
    # drawn uniformly from {2, 3, 4} effectively (0 and 1 dropped): item 2 ties, ~1/5 of 400
    assert 40 < ranks[0] < 130
    again = sampled_ranks(lambda lo, hi: scores[lo:hi], 1, np.array([0]), seen, 400, 0, 8)
    assert ranks.tolist() == again.tolist()


def test_sampled_eval_is_a_retrieval_tasks_option():
    raw = mapping()
    raw["objective"]["tasks"]["label"]["sampled_eval"] = -1
    with pytest.raises(ConfigError, match=r"objective\.tasks\.label\.sampled_eval"):
        config_from_mapping(raw)
    with pytest.raises(ConfigError, match=r"sampled_eval: ranks a retrieval task's target"):
        config_from_mapping({"objective": {"tasks": {"label": {"sampled_eval": 100}}},
                             "tables": [{"name": "t", "dim": 4, "features": ["f"]}]})
