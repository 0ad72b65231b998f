"""The dense model's data parallelism: DDP (the default) or FSDP2 (``fully_shard``), both with
the gradient reduction summing, not averaging: each rank's loss gradient is already its part
of the global batch's mean (``cosparse.parallel.loss``)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from cosparse.parallel.world import World


def _sum_hook(group, bucket):  # type: ignore[no-untyped-def]
    """DDP's all-reduce, without the division by the world size (no annotations: DDP checks
    them, and postponed annotations are strings)."""
    fut = dist.all_reduce(bucket.buffer(), group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def dense_parallel(model: nn.Module, kind: str, world: World, device: torch.device
                   ) -> nn.Module:
    """``model`` wrapped for data-parallel training of its dense parameters (the embedding
    collection holds no parameters: its rows live in the table placements)."""
    if kind == "ddp":
        ddp = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None,
            forward_sync_buffers=False)  # (its buffers are constants: nothing to sync)
        ddp.register_comm_hook(dist.group.WORLD, _sum_hook)
        return ddp
    from torch.distributed.fsdp import fully_shard

    units = [c for c in model.children() if any(p.requires_grad for p in c.parameters())]
    for unit in [*units, model]:  # every dense submodule its own FSDP unit, then the root
        fully_shard(unit)
        if world.backend == "nccl":  # (gloo has no PREMUL_SUM: see sum_fsdp2_gradients)
            unit.set_gradient_divide_factor(1.0)
    return model


def sum_fsdp2_gradients(optimizer: torch.optim.Optimizer, kind: str, world: World) -> None:
    """On gloo, FSDP2 averages its reduce-scatter (gloo has no pre-scaled sum); multiply the
    averaged gradient shards back by the world size before each dense step."""
    if kind != "fsdp2" or world.backend == "nccl":
        return

    def scale(opt: torch.optim.Optimizer, args: object, kwargs: object) -> None:
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.mul_(world.size)

    optimizer.register_step_pre_hook(scale)
