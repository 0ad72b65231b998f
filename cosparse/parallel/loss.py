"""The loss over the global batch, computed on every rank exactly as one process computes it.

Each rank sends its logits and labels to every rank (a few bytes per sample), so the loss value
is the global one, and its gradient with respect to this rank's logits is the global mean's:
``(sigmoid(x) - y) / N`` over the whole global batch, with the same kernels (and so the same
bits) as ``binary_cross_entropy_with_logits`` on one process. Every later gradient is then a
partial sum of the one-process gradient, so the dense model's gradient reduction sums rather
than averages.

A retrieval task's in-batch softmax couples the samples: each rank scores its users against the
global batch's items, gathered with their gradient (``GatherRows``), so it matches one process
within float tolerance (its sums run in another order), not bit for bit."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cosparse.nn.retrieval import Retrieval, in_batch_softmax
from cosparse.parallel.collectives import all_to_all
from cosparse.parallel.world import World


def _gather(x: torch.Tensor, sizes: list[int], world: World) -> torch.Tensor:
    return all_to_all(x.repeat(world.size), [x.shape[0]] * world.size, sizes,
                      world.out_group, world)


class GlobalBCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, sizes, world):  # type: ignore[override]
        x = _gather(logits.detach().contiguous(), sizes, world)
        y = _gather(labels.to(x.dtype).contiguous(), sizes, world)
        ctx.save_for_backward(x, y)
        ctx.span = (sum(sizes[: world.rank]), sizes[world.rank])
        return F.binary_cross_entropy_with_logits(x, y)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        x, y = ctx.saved_tensors
        start, n = ctx.span
        # over the whole global batch, then sliced: a vectorised kernel's tail elements may
        # round differently, so the slice's values are those of the one-process computation
        g = ((x.sigmoid() - y) * grad) / x.shape[0]
        return g[start : start + n], None, None, None


def global_bce(logits: torch.Tensor, labels: torch.Tensor, sizes: list[int] | None,
               world: World) -> torch.Tensor:
    """The mean binary cross-entropy of the global batch (``sizes``: each rank's samples;
    None: asked of the ranks)."""
    if sizes is None:
        n = torch.tensor([logits.shape[0]], dtype=torch.int64)
        sizes = _gather(n, [1] * world.size, world).tolist()
    return GlobalBCE.apply(logits, labels, sizes, world)


class GatherRows(torch.autograd.Function):
    """Every rank's rows [n_r, D] in rank order, on every rank (``sizes``: each rank's n_r);
    the gradient of this rank's rows is every rank's gradient of them, summed in rank order."""

    @staticmethod
    def forward(ctx, rows, sizes, world):  # type: ignore[override]
        ctx.sizes, ctx.world = sizes, world
        n = rows.shape[0]
        return all_to_all(rows.contiguous().repeat(world.size, 1), [n] * world.size, sizes,
                          world.out_group, world)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        sizes, world = ctx.sizes, ctx.world
        n = sizes[world.rank]
        back = all_to_all(grad.contiguous(), list(sizes), [n] * world.size, world.out_group,
                          world)
        return back.view(world.size, n, *grad.shape[1:]).sum(0), None, None


def retrieval_loss(out: Retrieval, temperature: float, world: World | None,
                   sizes: list[int] | None, observe: bool = True,
                   negative_pool: int = 0) -> torch.Tensor:
    """This rank's summed in-batch softmax loss of a retrieval task (``cosparse.nn.retrieval``):
    on many ranks against the global batch's items, gathered with their gradient, in rank
    order, then the global batch's uniform negatives (``out.negatives``, drawn from
    ``negative_pool`` items) likewise. ``observe``: count the batch's items in the frequency
    estimate first (a training step's loss; the global batch's, so every rank keeps the same
    counts)."""
    b = out.users.shape[0]
    if world is not None and sizes is None:
        n = torch.tensor([b], dtype=torch.int64)
        sizes = _gather(n, [1] * world.size, world).tolist()
    all_items, all_ids, offset = _global(out.items, out.item_ids, 1, sizes, world)
    if observe and out.frequency is not None:
        out.frequency.observe(all_ids)
    uniform = 0.0
    if out.negatives is not None:
        assert out.negative_ids is not None
        if negative_pool <= 0:
            raise ValueError("retrieval loss: the model gave uniform negatives, but the batch "
                             "names no pool they were drawn from (SparseBatch.negative_pool)")
        k = out.negatives.shape[0] // max(b, 1)
        negatives, negative_ids, _ = _global(out.negatives, out.negative_ids, k, sizes, world)
        all_items = torch.cat([all_items, negatives])
        all_ids = torch.cat([all_ids, negative_ids.to(all_ids.device)])
        uniform = k / negative_pool
    log_q = None
    if out.frequency is not None:
        log_q = out.frequency.log_q(all_ids, uniform).to(all_items.device)
    return in_batch_softmax(out.users, out.item_ids, all_items, all_ids, offset, log_q,
                            temperature)


def _global(rows: torch.Tensor, ids: torch.Tensor, per_sample: int, sizes: list[int] | None,
            world: World | None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Every rank's ``rows`` (``per_sample`` of them per sample) and their ``ids``, in rank
    order, gathered with the rows' gradient; and where this rank's begin."""
    if world is None:
        return rows, ids, 0
    assert sizes is not None
    counts = [per_sample * s for s in sizes]
    return (GatherRows.apply(rows, counts, world), _gather(ids.contiguous(), counts, world),
            sum(counts[: world.rank]))


def global_sum(local: torch.Tensor, batch_size: int, sizes: list[int] | None,
               world: World) -> torch.Tensor:
    """The sum of every rank's ``local`` (a scalar: this rank's summed loss) divided by the
    global batch size (``batch_size``: this rank's samples; ``sizes``: each rank's, None: asked
    of the ranks). Its value is the global one on every rank; its gradient is this rank's part
    (``local`` / N), so the dense model's summed gradient reduction gives the global mean's
    gradient whatever the objective."""
    if sizes is None:
        n = torch.tensor([batch_size], dtype=torch.int64)
        sizes = _gather(n, [1] * world.size, world).tolist()
    parts = _gather(local.detach().reshape(1), [1] * world.size, world)
    others = parts.sum() - local.detach()  # (summed in rank order: the same on every rank)
    return (local + others) / sum(sizes)
