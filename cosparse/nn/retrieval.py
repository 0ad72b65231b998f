"""Two-tower retrieval's pieces: what a retrieval model's forward gives its task (``Retrieval``),
the streaming item-frequency estimate behind the logQ correction (``ItemFrequency``), and the
sampled softmax over in-batch negatives (``in_batch_softmax``).

The loss (Yi et al., RecSys 2019): each sample's user against every item of the batch (on many
ranks, of the global batch), ``u . v_j / temperature - log q_j``, softmax cross-entropy with its
own item as the class. ``q_j`` is item j's estimated share of the training stream: popular items
appear as negatives more often, and the correction keeps them from being pushed down for it. A
batch's other samples of the same item are not its negatives. Everything is torch arithmetic in
a fixed order, and the frequency estimate is integer counting, so a run is bit-identical on
every placement and resumes exactly (the counts are buffers of the model's state).

Mixed negatives (``data.events.uniform_negatives``) add ``k`` uniformly drawn items per sample
as columns. Per sample, an item then comes as a column ``p_j`` times from the batch and ``k /
items`` times from the uniform draws (``items``: the pool they come from), so the correction
becomes ``log(p_j + k / items)``, for the batch's and the drawn columns alike.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from cosparse.nn.model_batch import Batch

_MIX = -7046029254386353131  # 0x9E3779B97F4A7C15 as int64: Fibonacci hashing's multiplier


class Retrieval(NamedTuple):
    """A retrieval task's output: each sample's ``users`` and ``items`` embeddings [B, D], its
    item's ID ``item_ids`` [B] (int64, raw), the estimate of the stream's item frequencies
    (None: no logQ correction), and the uniform negatives' embeddings [B * k, D] and IDs
    [B * k], sample-major (None: in-batch negatives only; ``cosparse.data.uniform_negatives``)."""

    users: torch.Tensor
    items: torch.Tensor
    item_ids: torch.Tensor
    frequency: ItemFrequency | None = None
    negatives: torch.Tensor | None = None
    negative_ids: torch.Tensor | None = None


class ItemFrequency(nn.Module):
    """Each item's count in the training stream so far, in a count-min sketch (``depth`` rows
    of ``2**bits`` int64 counters, each row its own hash of the ID): ``log_q(ids)`` is the log
    of the smallest of an ID's counters over the items counted. Counters only grow; collisions
    only overcount. The counters are buffers, so checkpoints carry them."""

    def __init__(self, bits: int = 20, depth: int = 2) -> None:
        super().__init__()
        self.bits = bits
        self.register_buffer("counts", torch.zeros(depth, 1 << bits, dtype=torch.int64))
        self.register_buffer("total", torch.zeros((), dtype=torch.int64))

    def _buckets(self, ids: torch.Tensor) -> torch.Tensor:
        """[depth, n]: each row's counter of each ID (multiply-shift hashing, row r salted)."""
        rows = torch.arange(1, self.counts.shape[0] + 1, dtype=torch.int64, device=ids.device)
        mixed = (ids.to(torch.int64)[None, :] + rows[:, None] * 0x632BE59BD9B4E019) * _MIX
        return (mixed >> (64 - self.bits)) & ((1 << self.bits) - 1)

    @torch.no_grad()
    def observe(self, ids: torch.Tensor) -> None:
        """Count ``ids`` (each occurrence) in the stream."""
        ids = ids.to(self.counts.device)
        for r, b in enumerate(self._buckets(ids)):
            self.counts[r].index_add_(0, b, torch.ones_like(b))
        self.total += ids.shape[0]

    @torch.no_grad()
    def log_q(self, ids: torch.Tensor, uniform: float = 0.0) -> torch.Tensor:
        """[n] float32: log(count / total) of each ID (an ID not counted yet counts 1), or with
        ``uniform`` (a uniform negative's expected draws of each item per sample: k / items)
        log(count / total + uniform): the expected share, per sample, of the mixed negatives'
        columns that are the item."""
        ids = ids.to(self.counts.device)
        b = self._buckets(ids)
        counts = torch.gather(self.counts, 1, b).min(dim=0).values.clamp(min=1)
        share = counts.double() / max(int(self.total), 1)
        return (share + uniform if uniform else share).log().float()


def retrieval_output(model: nn.Module, batch: Batch, item: list[str]) -> Retrieval:
    """A retrieval model's output on ``batch``: its ``encode_users``, its ``encode_items`` of the
    batch's items (``item``: their features, the ID feature ``model.id_feature`` among them) and
    of the uniform negatives (``model.negative_features``: per negative, its features in
    ``item``'s order; none: in-batch negatives only)."""
    feats = batch.sparse.to_dict()
    ids = feats[model.id_feature].values
    negatives, negative_ids = None, None
    if model.negative_features:
        at = item.index(model.id_feature)
        negatives = model.encode_items(batch, model.negative_features)
        negative_ids = torch.stack([feats[g[at]].values for g in model.negative_features],
                                   dim=1).flatten()  # (sample-major, as the embeddings)
    return Retrieval(model.encode_users(batch), model.encode_items(batch), ids,
                     model.frequency, negatives, negative_ids)


def in_batch_softmax(users: torch.Tensor, item_ids: torch.Tensor, all_items: torch.Tensor,
                     all_ids: torch.Tensor, offset: int, log_q: torch.Tensor | None,
                     temperature: float) -> torch.Tensor:
    """The summed softmax cross-entropy of ``users`` [B, D] against ``all_items`` [N, D] (the
    batch's items: ``all_items[offset + i]`` is sample i's own; on one process ``all_items`` is
    ``items``), each logit ``u . v / temperature - log_q`` (``log_q`` [N] or None); a column of
    sample i's own item ID other than its own is left out (-inf): the same item is no
    negative."""
    logits = users @ all_items.T / temperature
    if log_q is not None:
        logits = logits - log_q[None, :]
    b = users.shape[0]
    own = torch.arange(b, device=users.device) + offset
    same = item_ids.to(all_ids.device)[:, None] == all_ids[None, :]
    same[torch.arange(b), own] = False
    logits = logits.masked_fill(same.to(logits.device), float("-inf"))
    return F.cross_entropy(logits, own.to(logits.device), reduction="sum")
