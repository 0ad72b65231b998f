"""The ranks of one run, as torchrun started them: the process group (gloo on CPU, NCCL on
CUDA) and the side groups that let the ID exchange of the next batch run on the prefetch thread
while this batch's rows and gradients move on the trainer's thread.

Collectives of one group must be issued in the same order on every rank; each group here is
used by one thread only, which is what makes two threads' collectives safe.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from cosparse.config import Config, ConfigError


def launched_by_torchrun() -> bool:
    """True in a process that torchrun (or any launcher setting its variables) started."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


@dataclass
class World:
    """This process's place among the ranks, and the groups its collectives use."""

    rank: int
    size: int
    local_rank: int
    ranks_per_node: int
    backend: str
    ids_group: Any = None  # the prefetch thread's: input distribution of training batches
    out_group: Any = None  # the trainer thread's: output distribution and its backward
    dp_group: Any = None  # the trainer thread's: replicated tables' gradients
    # this rank's collectives: bytes sent to other ranks, time spent in them (both threads),
    # and the forward output distribution's time, the receiver's sums included (for row-wise
    # tables: gloo's emulated reduce-scatter)
    comm: dict[str, float] = field(default_factory=lambda: {"sent_bytes": 0, "wait_ms": 0.0,
                                                            "output_dist_ms": 0.0})
    owns_default: bool = False  # this World joined the default group (and leaves it on close)

    @property
    def node(self) -> int:
        return self.rank // self.ranks_per_node

    @property
    def nodes(self) -> int:
        return self.size // self.ranks_per_node

    @property
    def leader(self) -> bool:
        """Rank 0: the one that writes metrics, TensorBoard and the progress bar."""
        return self.rank == 0

    def count(self, nbytes: int, ms: float) -> None:
        self.comm["sent_bytes"] += int(nbytes)
        self.comm["wait_ms"] += ms

    def close(self) -> None:
        """Leave the side groups, and the default group if this World joined it."""
        if not dist.is_initialized():
            return
        for g in (self.ids_group, self.out_group, self.dp_group):
            if g is not None:
                dist.destroy_process_group(g)
        self.ids_group = self.out_group = self.dp_group = None
        if self.owns_default:
            dist.destroy_process_group()


def from_leader(world: World, value: object = None) -> object:
    """Rank 0's ``value``, on every rank (the others pass nothing)."""
    box = [value if world.leader else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def start_world(cfg: Config, device: torch.device) -> World:
    """Join the process group that torchrun's environment describes."""
    env = os.environ
    size, rank = int(env["WORLD_SIZE"]), int(env["RANK"])
    local_size = int(env.get("LOCAL_WORLD_SIZE", size))
    par = cfg.parallel
    if par.ranks_per_node is not None and par.ranks_per_node != local_size:
        raise ConfigError(f"parallel.ranks_per_node: {par.ranks_per_node}, but torchrun started "
                          f"{local_size} rank(s) per node (--nproc-per-node)")
    if size % local_size:
        raise ConfigError(f"torchrun started {size} ranks, not a whole number of nodes of "
                          f"{local_size}")
    backend = par.backend
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise ConfigError("parallel.backend: nccl needs train.device cuda")
    timeout = datetime.timedelta(seconds=cfg.train.stall_timeout_s or 1800)
    joins = not dist.is_initialized()  # (a caller that joined already keeps the group)
    if joins:
        dist.init_process_group(backend, timeout=timeout)
    # gloo carries the host-side ID exchange even beside NCCL: IDs live on the host
    world = World(rank, size, int(env.get("LOCAL_RANK", rank % local_size)), local_size, backend,
                  owns_default=joins)
    world.ids_group = dist.new_group(backend="gloo", timeout=timeout)
    world.out_group = dist.new_group(backend=backend, timeout=timeout)
    world.dp_group = dist.new_group(backend=backend, timeout=timeout)
    return world
