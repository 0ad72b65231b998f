"""Transformer layers over unpooled behaviour histories (``pooling: none`` lookups, most recent
event first): SASRec's causal self-attention blocks (Kang and McAuley, ICDM 2018) and BST's
target attention (Chen et al., DLP-KDD 2019).

Attention runs through ``torch.nn.functional.scaled_dot_product_attention``: a causal sequence
passes ``is_causal`` and no mask, so its fused kernels never build the [L, L] scores of a long
history; a padded one passes a [B, 1, 1, L] key mask. Attention itself has no dropout: SDPA
would draw it from torch's global generator, whose position may depend on the placement (see
``cosparse.nn.dropout``); the blocks' dropout is ``SeededDropout`` on their outputs.

SASRec's rows stay jagged outside attention, which pads them per batch to the longest history
with each sample's events oldest first: the padding follows the last event, so the causal
outputs at real positions never see it and need no mask.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from cosparse.nn.dropout import TowerDropout
from cosparse.nn.types import Jagged


def _segments(hist: Jagged) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``hist.values``: its sample, and its recency (0: the most recent event)."""
    n = hist.values.shape[0]
    dev = hist.values.device
    seg = torch.repeat_interleave(torch.arange(hist.batch_size, device=dev), hist.lengths,
                                  output_size=n)
    return seg, torch.arange(n, device=dev) - hist.offsets[:-1].index_select(0, seg)


def by_recency(hist: Jagged) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, L, D] of a history, most recent event first, zeros after; [B, L] bool, True at a
    real event); L = the longest history (at least 1)."""
    b, d = hist.batch_size, hist.values.shape[1]
    longest = int(hist.lengths.max()) if b and hist.values.shape[0] else 0
    length = max(longest, 1)
    seg, recency = _segments(hist)
    out = hist.values.new_zeros(b, length, d).index_put((seg, recency), hist.values)
    real = torch.arange(length, device=out.device)[None, :] < hist.lengths[:, None]
    return out, real


Attend = Callable[[torch.Tensor], torch.Tensor]


class AttentionBlock(nn.Module):
    """One post-norm transformer layer (as SASRec's and BERT's): multi-head self-attention,
    dropout, residual, LayerNorm; a GELU feed-forward of ``inner`` units, dropout, residual,
    LayerNorm."""

    def __init__(self, dim: int, heads: int, inner: int, dropout: TowerDropout | None,
                 eps: float = 1e-12) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"heads: {heads} heads do not divide the width {dim}")
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.ffn = nn.Sequential(nn.Linear(dim, inner), nn.GELU(), nn.Linear(inner, dim))
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.drop1 = dropout.layer() if dropout is not None else nn.Identity()
        self.drop2 = dropout.layer() if dropout is not None else nn.Identity()

    def forward(self, x: torch.Tensor, attend: Attend,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` [..., D]; ``attend`` maps the heads' queries, keys and values of every row
        [..., 3, H, D / H] to the attention's output [..., H, D / H] of the rows that go on:
        all, or ``rows`` of the first dimension."""
        a = attend(self.qkv(x).unflatten(-1, (3, self.heads, -1))).flatten(-2)
        if rows is not None:
            x = x.index_select(0, rows)
        x = self.norm1(x + self.drop1(self.out(a)))
        return self.norm2(x + self.drop2(self.ffn(x)))


class CausalEncoder(nn.Module):
    """SASRec's sequence encoder: learned positions (0: the oldest event kept) added to the
    events' embeddings, LayerNorm, dropout, ``layers`` causal blocks; ``forward`` gives each
    sample's output at its most recent event [B, D] (a sample without history: that of one
    event of zeros).

    The rows stay jagged (no padding) through the projections and feed-forwards; only
    attention pads them, per batch, to the longest history. The last block computes the most
    recent event's row alone: its query against every key of the sample."""

    def __init__(self, dim: int, max_len: int, layers: int, heads: int, inner: int,
                 dropout: TowerDropout | None) -> None:
        super().__init__()
        self.positions = nn.Embedding(max_len, dim)
        self.norm = nn.LayerNorm(dim, eps=1e-12)
        self.drop = dropout.layer() if dropout is not None else nn.Identity()
        self.blocks = nn.ModuleList(AttentionBlock(dim, heads, inner, dropout)
                                    for _ in range(layers))

    def forward(self, hist: Jagged) -> torch.Tensor:
        hist = _at_least_one(hist)
        b = hist.batch_size
        length = int(hist.lengths.max()) if b else 1
        if length > self.positions.num_embeddings:
            raise ValueError(f"SASRec: a history of {length} events, longer than the "
                             f"{self.positions.num_embeddings} positions it was built for "
                             "(data.events.max_len)")
        seg, recency = _segments(hist)
        pos = hist.lengths.index_select(0, seg) - 1 - recency
        x = self.drop(self.norm(hist.values + self.positions(pos)))
        last = hist.offsets[:-1]  # (each sample's most recent event: recency 0)
        real = torch.arange(length, device=x.device)[None, :] < hist.lengths[:, None]

        def padded(h: torch.Tensor) -> torch.Tensor:  # [n, 3, H, d] -> [3, B, H, L, d]
            out = h.new_zeros(b, length, *h.shape[1:]).index_put((seg, pos), h)
            return out.permute(2, 0, 3, 1, 4)

        def causal(h: torch.Tensor) -> torch.Tensor:
            q, k, v = padded(h)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return a.permute(0, 2, 1, 3)[seg, pos]

        def most_recent(h: torch.Tensor) -> torch.Tensor:
            _, k, v = padded(h)
            q = h[last, 0].unsqueeze(2)  # [B, H, 1, d]
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=real[:, None, None, :])
            return a.squeeze(2)

        for block in self.blocks[:-1]:
            x = block(x, causal)
        return self.blocks[-1](x, most_recent, last)


def _at_least_one(hist: Jagged) -> Jagged:
    """``hist`` with one row of zeros for each sample without history."""
    empty = hist.lengths == 0
    if not bool(empty.any()):
        return hist
    lengths = torch.where(empty, torch.ones_like(hist.lengths), hist.lengths)
    offsets = torch.zeros_like(hist.offsets)
    torch.cumsum(lengths, 0, out=offsets[1:])
    seg, recency = _segments(hist)
    values = hist.values.new_zeros(int(offsets[-1]), hist.values.shape[1])
    values = values.index_put((offsets[:-1].index_select(0, seg) + recency,), hist.values)
    return Jagged(values, lengths, offsets)


class TargetTransformer(nn.Module):
    """BST's attention: the target and its history (most recent first, ``max_len`` positions
    at most, each with a learned recency embedding; the target at position 0) through
    ``layers`` bidirectional blocks that see only real events; ``forward`` gives the target's
    output [B, D]: the target attended over its history."""

    def __init__(self, dim: int, max_len: int, layers: int, heads: int, inner: int,
                 dropout: TowerDropout | None) -> None:
        super().__init__()
        self.positions = nn.Embedding(max_len + 1, dim)
        self.blocks = nn.ModuleList(AttentionBlock(dim, heads, inner, dropout)
                                    for _ in range(layers))

    def forward(self, target: torch.Tensor, hist: Jagged) -> torch.Tensor:
        h, real = by_recency(hist)
        x = torch.cat([target[:, None, :], h], dim=1)
        if x.shape[1] > self.positions.num_embeddings:
            raise ValueError(f"BST: a history of {x.shape[1] - 1} events, longer than the "
                             f"{self.positions.num_embeddings - 1} it was built for (max_len)")
        x = x + self.positions.weight[:x.shape[1]][None]
        keys = torch.cat([real.new_ones(real.shape[0], 1), real], dim=1)[:, None, None, :]

        def attend(h: torch.Tensor) -> torch.Tensor:  # [B, L, 3, H, d] -> [B, L, H, d]
            q, k, v = h.permute(2, 0, 3, 1, 4)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keys).transpose(1, 2)

        for block in self.blocks:
            x = block(x, attend)
        return x[:, 0]
