"""The collectives of the sharded lookup, with their backward: an all-to-all whose gradient is
the reverse all-to-all, and the slice of a replicated table's global output whose gradient
gathers every rank's slice (so each replica applies the same, global update).

Each counts the bytes it sends to other ranks and the time it takes (``World.count``): the
rank-rank link.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from cosparse.parallel.world import World


def all_to_all(send: torch.Tensor, send_splits: list[int], recv_splits: list[int],
               group: Any, world: World) -> torch.Tensor:
    """One ``all_to_all_single``: ``send`` holds the rows for rank 0, then rank 1, ... (first
    dimension split by ``send_splits``); returns what each rank sent this one, in rank order."""
    t0 = time.perf_counter()
    recv = send.new_empty((sum(recv_splits), *send.shape[1:]))
    dist.all_to_all_single(recv, send.contiguous(), recv_splits, send_splits, group=group)
    per_row = send.element_size() * (send[0].numel() if send.dim() > 1 and send.shape[0] else 1)
    world.count((sum(send_splits) - send_splits[world.rank]) * per_row,
                (time.perf_counter() - t0) * 1e3)
    return recv


class AllToAll(torch.autograd.Function):
    """Differentiable ``all_to_all``: the backward sends each gradient back where its row came
    from."""

    @staticmethod
    def forward(ctx, send, send_splits, recv_splits, group, world):  # type: ignore[override]
        ctx.splits = (send_splits, recv_splits)
        ctx.group, ctx.world = group, world
        return all_to_all(send, send_splits, recv_splits, group, world)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        send_splits, recv_splits = ctx.splits
        back = all_to_all(grad.contiguous(), recv_splits, send_splits, ctx.group, ctx.world)
        return back, None, None, None, None


class ReplicaSlice(torch.autograd.Function):
    """This rank's slice of a replicated (data-parallel) table's output over the global batch.

    ``full`` holds rank 0's slice, then rank 1's, ... (``splits``); every rank computed the same
    ``full``. The backward gathers every rank's slice gradient into the gradient of ``full``,
    so every replica sums each row's gradient over the whole global batch, in sample order."""

    @staticmethod
    def forward(ctx, full, splits, group, world):  # type: ignore[override]
        ctx.splits, ctx.group, ctx.world = splits, group, world
        start = sum(splits[: world.rank])
        return full[start : start + splits[world.rank]].clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        splits, world = ctx.splits, ctx.world
        mine = grad.contiguous()
        send = mine.repeat(world.size)  # (flat) this rank's slice for every rank
        back = all_to_all(send, [mine.shape[0]] * world.size, list(splits), ctx.group, world)
        return back, None, None, None
