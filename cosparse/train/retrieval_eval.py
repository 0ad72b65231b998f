"""The evaluation of a retrieval task over the whole item corpus: each eval sample's user
embedding scored against every item's, the target's rank among the items the user had not
interacted with before it, and from the ranks recall@10, NDCG@10 and MRR, for the model and, on
the same samples and masks, for the baselines of ``cosparse.train.retrieval_baselines``:
``recall@10``, ``ndcg@10``, ``mrr``, ``recall@10.popularity``, ``recall@10.transitions``, ...

Exact, not sampled: a target's rank is the number of unmasked items scoring above it, plus those
scoring the same with a smaller corpus index (ties broken by ID, the same way for both). The
scores are computed in chunks of users (``CHUNK`` x corpus floats at a time). On many ranks each
rank encodes its part of each eval batch and every rank ranks the gathered whole, in eval order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from cosparse.config.objective import TaskConfig
from cosparse.data import BatchStream
from cosparse.data.item_corpus import item_corpus, ranking_inputs, transitions
from cosparse.nn.model_batch import Batch
from cosparse.train.evaluate import joined_batches
from cosparse.train.inputs import WORKER_PRELOAD
from cosparse.train.retrieval_baselines import sampled_ranks, shared_ranks, transition_scores

K = 10
CHUNK = 1024


def ranking_metrics(ranks: np.ndarray, suffix: str = "") -> dict[str, float]:
    """recall@K, NDCG@K (one relevant item) and MRR of 0-based ``ranks``."""
    r = ranks.astype(np.float64)
    hit = r < K
    return {f"recall@{K}{suffix}": float(hit.mean()),
            f"ndcg@{K}{suffix}": float((hit / np.log2(r + 2.0)).mean()),
            f"mrr{suffix}": float((1.0 / (r + 1.0)).mean())}


def target_ranks(scores: torch.Tensor, targets: torch.Tensor, seen_rows: torch.Tensor,
                 seen_cols: torch.Tensor) -> torch.Tensor:
    """[B] 0-based rank of column ``targets[b]`` in row b of ``scores`` [B, N], the columns
    ``seen_cols`` of rows ``seen_rows`` left out (never the target itself): the columns that
    precede the target (a higher score, or the same and a smaller index), less the seen ones
    among them (each seen column once). ``scores`` is only read."""
    rows = torch.arange(scores.shape[0])
    own = scores[rows, targets][:, None]
    cols = torch.arange(scores.shape[1])
    ahead = (scores > own) | ((scores == own) & (cols[None, :] < targets[:, None]))
    pairs = torch.unique(seen_rows * scores.shape[1] + seen_cols)
    r, c = pairs // scores.shape[1], pairs % scores.shape[1]
    counted = ahead[r, c]  # (the target never precedes itself)
    return ahead.sum(1) - torch.zeros_like(rows).index_add_(0, r, counted.long())


def rank_all(scores_of: Callable[[int, int], torch.Tensor], n: int, targets: np.ndarray,
             seen: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Each of ``n`` users' target rank, ``CHUNK`` users at a time: ``scores_of(lo, hi)`` gives
    users lo..hi's scores [hi - lo, N]; ``seen``: flat corpus indices and a count per user of
    the items left out."""
    flat, counts = seen
    starts = np.concatenate([[0], np.cumsum(counts)])
    out = np.empty(n, np.int64)
    for lo in range(0, n, CHUNK):
        hi = min(lo + CHUNK, n)
        rows = torch.from_numpy(np.repeat(np.arange(hi - lo), counts[lo:hi]))
        cols = torch.from_numpy(flat[starts[lo]:starts[hi]])
        out[lo:hi] = target_ranks(scores_of(lo, hi), torch.from_numpy(targets[lo:hi]), rows,
                                  cols).numpy()
    return out


def evaluate_retrieval(trainer: Any) -> dict[str, Any]:
    """The retrieval metrics of ``trainer``'s model (a model with ``encode_users`` and
    ``encode_items``) over its eval split, with popularity's beside them."""
    model, reader = trainer.model, trainer.eval_reader
    inner = model.model
    device = trainer.ec.device
    model.eval()
    with torch.no_grad():
        corpus_ids, corpus = item_corpus(reader, max(trainer.cfg.data.batch_size, 1024))
        items = torch.cat([inner.encode_items(Batch(trainer.ec.prepare(b), device)).cpu()
                           for b in corpus])
        parts: list[np.ndarray] = []
        with BatchStream(reader, trainer.cfg.data.workers, trainer.cfg.data.queue_depth,
                         preload=WORKER_PRELOAD) as s:
            want = trainer.cfg.data.eval_batch_size or max(trainer.cfg.data.batch_size, 1024)
            for batch in trainer._mine(joined_batches(s, want)):
                trainer.progress.beat(f"evaluating at step {trainer.state.step}")
                parts.append(inner.encode_users(Batch(trainer.ec.prepare(batch), device))
                             .cpu().numpy())
    model.train()
    users = torch.from_numpy(_in_eval_order(parts, trainer))
    targets, seen, popularity = ranking_inputs(reader, corpus_ids)
    n = users.shape[0]
    def model_scores(lo: int, hi: int) -> torch.Tensor:
        return users[lo:hi] @ items.T
    out: dict[str, Any] = {"eval_samples": n, "corpus_items": len(corpus_ids)}
    out.update(ranking_metrics(rank_all(model_scores, n, targets, seen)))
    out.update(ranking_metrics(shared_ranks(popularity, targets, seen), ".popularity"))
    out.update(ranking_metrics(rank_all(transition_scores(popularity, *transitions(
        reader, corpus_ids)), n, targets, seen), ".transitions"))
    sampled = retrieval_task(trainer).sampled_eval
    if sampled:
        out.update(ranking_metrics(sampled_ranks(model_scores, n, targets, seen, sampled,
                                                 trainer.cfg.train.seed, CHUNK),
                                   f".sampled{sampled}"))
    return out


def retrieval_task(trainer: Any) -> TaskConfig:
    """The trainer's objective's retrieval task (its only task)."""
    return next(iter(trainer.objective.tasks.values()))


def _in_eval_order(parts: list[np.ndarray], trainer: Any) -> np.ndarray:
    """This rank's user embeddings of each eval batch, or on many ranks every rank's, batch by
    batch in rank order: the eval split's order."""
    if trainer.ranks is None:
        return np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)
    everyone: list[Any] = [None] * trainer.ranks.world.size
    torch.distributed.all_gather_object(everyone, parts)
    return np.concatenate([p for batch in zip(*everyone, strict=True) for p in batch])
