"""The run's CPU budget (``train.cpu``): how many threads each of its pools gets, decided once from
the cores this process may use (its affinity mask) and applied before any pool starts.

The pools, and their share:
- the trainer: torch's intra-op threads and numba's threads (forward, backward, optimizers,
  gathers), ``threads``;
- the prefetch/planner thread: numba, 1 thread (``cosparse.train.prefetch`` sets it);
- each data worker: 1 thread, in a process of its own (``cosparse.data.worker_loop`` sets it);
- each embedded PS shard: 1 thread (numba and OpenMP), in a process of its own
  (``cosparse.ps.embedded`` sets it through the shard's environment).

Every process of the run waits passively in its OpenMP pools (``cosparse.omp_wait``).

``threads: auto`` gives the trainer the cores left after ``reserve_for_workers``; that one's
``auto`` reserves a core per data worker and embedded shard, but never every core: the trainer
keeps at least one. Oversubscribing the cores costs more than idling one: a parallel region
(an ``embedding_bag``, a backward op, an optimizer step) ends only when every one of its threads
has been scheduled, so each region pays the scheduler's latency once threads outnumber free cores.

Written by hand: torchrun sets a thread count per process, but nothing divides one host's cores
between a trainer and its helper processes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from cosparse.config import Config


@dataclass(frozen=True)
class CpuShares:
    """How the run's cores are divided (plain data: ``plan_cpu`` decides, ``apply_cpu`` applies)."""

    cores: int  # the cores this process may run on
    reserved: int  # cores left to the data workers and embedded shards
    trainer_threads: int  # torch intra-op and numba threads of the trainer
    child_threads: int  # threads of each data worker
    helpers: int  # data workers + embedded shards

    def describe(self) -> str:
        return (f"cpu: {self.cores} cores; trainer {self.trainer_threads} threads, "
                f"{self.reserved} reserved for {self.helpers} workers/shards "
                f"({self.child_threads} thread each)")


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask; the CPU count where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def plan_cpu(cores: int, threads: int | Literal["auto"],
             reserve_for_workers: int | Literal["auto"], workers: int, embedded_shards: int
             ) -> CpuShares:
    """Divide ``cores`` between the trainer and its ``workers`` + ``embedded_shards`` helpers.

    An explicit ``threads`` is taken as given (also above the cores: the user's choice); ``auto``
    is the cores left after the reserve, at least 1."""
    helpers = workers + embedded_shards
    if reserve_for_workers == "auto":
        reserved = min(helpers, cores - 1)
    else:
        reserved = min(reserve_for_workers, max(cores - 1, 0))
    trainer = threads if threads != "auto" else max(1, cores - reserved)
    return CpuShares(cores=cores, reserved=reserved, trainer_threads=trainer, child_threads=1,
                     helpers=helpers)


def cpu_shares(cfg: Config, cores: int | None = None) -> CpuShares:
    """The budget of a run of ``cfg`` (``train.cpu``, or ``train.threads``) on ``cores`` (default:
    the usable cores): its data workers, and its PS shards when it starts them itself."""
    cpu = cfg.train.cpu
    threads = cfg.train.threads if cfg.train.threads is not None else cpu.threads
    shards = (cfg.store.remote.num_shards
              if cfg.supply.path != "resident" and cfg.store.remote.embedded else 0)
    return plan_cpu(usable_cores() if cores is None else cores, threads,
                    cpu.reserve_for_workers, cfg.data.workers, shards)


def apply_cpu(shares: CpuShares) -> None:
    """Set the trainer's torch and numba threads (this thread's, and the pools' they start)."""
    import numba
    import torch

    # numba first: its threading layer here is OpenMP, the same libgomp as torch's, and the first
    # set_num_threads launches its pool, which sets the thread's OpenMP thread count to numba's
    # NUMBA_NUM_THREADS and so undoes a torch setting made before it (seen: torch at 1 came back
    # at 2, the cores, once numba's pool started)
    numba.set_num_threads(min(shares.trainer_threads, numba.config.NUMBA_NUM_THREADS))
    torch.set_num_threads(shares.trainer_threads)
