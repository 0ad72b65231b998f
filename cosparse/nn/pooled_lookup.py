"""Pooled lookup through an inverse index, with a fast backward.

Forward: ``embedding_bag`` over the compact buffer of unique rows. Backward: the gradient of each
unique row is another ``embedding_bag``, over the transposed (row -> bags) index, which sums a
row's contributions in sample order. This avoids autograd's sparse path and its coalescing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class PooledLookup(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        weights: torch.Tensor,
        inverse: torch.Tensor,
        offsets: torch.Tensor,
        t_offsets: torch.Tensor,
        t_bags: torch.Tensor,
        t_weights: torch.Tensor,
        mean: bool,
    ) -> torch.Tensor:
        ctx.save_for_backward(t_offsets, t_bags, t_weights)
        ctx.mean = mean
        return F.embedding_bag(
            inverse, weights, offsets, mode="mean" if mean else "sum", include_last_offset=True
        )

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        t_offsets, t_bags, t_weights = ctx.saved_tensors
        grad_w = F.embedding_bag(
            t_bags,
            grad_out.contiguous(),
            t_offsets,
            mode="sum",
            per_sample_weights=t_weights if ctx.mean else None,
            include_last_offset=True,
        )
        return grad_w, None, None, None, None, None, None


def pooled_lookup(
    weights: torch.Tensor,
    inverse: torch.Tensor,
    offsets: torch.Tensor,
    t_offsets: torch.Tensor,
    t_bags: torch.Tensor,
    t_weights: torch.Tensor,
    mean: bool,
) -> torch.Tensor:
    """[num_bags, dim] pooled rows; d/d(weights) via the transposed index."""
    return PooledLookup.apply(weights, inverse, offsets, t_offsets, t_bags, t_weights, mean)
