"""A batch's per-table ID work (dedup and the transposed index) spread over threads.

The ID kernels release the GIL, so two tables' work runs on two cores at once. The thread count
is the calling thread's numba thread count: the trainer's budget (``train.cpu``) when the work
runs inline, between the dense compute of two steps, and 1 on the prefetch thread, which overlaps
the dense compute and must not take its cores (``cosparse.train.prefetch``). The tables go to
the threads largest first, in turn; the caller takes the first share itself.

The helper threads are one shared pool (``cosparse-prep``), started on first use; its threads
run their kernels on one numba thread each. Every wait is bounded (``WAIT_S``) and its error
names both sides. Written by hand: ``ThreadPoolExecutor.map`` gives no bound on the wait.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import numba

WAIT_S = 120.0  # one batch's ID work takes milliseconds; this bounds a wedged helper

T = TypeVar("T")
R = TypeVar("R")

_pool: cf.ThreadPoolExecutor | None = None
_pool_threads = 0
_lock = threading.Lock()


def _one_numba_thread() -> None:
    numba.set_num_threads(1)


def _helpers(n: int) -> cf.ThreadPoolExecutor:
    global _pool, _pool_threads
    with _lock:
        if _pool is None or _pool_threads < n:
            old = _pool
            _pool = cf.ThreadPoolExecutor(n, thread_name_prefix="cosparse-prep",
                                          initializer=_one_numba_thread)
            _pool_threads = n
            if old is not None:
                old.shutdown(wait=False)
        return _pool


def map_tables(fn: Callable[[T], R], items: Sequence[T], sizes: Sequence[int],
               threads: int | None = None) -> list[R]:
    """``[fn(x) for x in items]`` on up to ``threads`` threads (default: the calling thread's
    numba thread count), the caller's among them; ``sizes`` orders the work, largest first."""
    threads = min(numba.get_num_threads() if threads is None else threads, len(items))
    if threads <= 1:
        return [fn(x) for x in items]
    order = sorted(range(len(items)), key=lambda i: -sizes[i])
    shares = [order[k::threads] for k in range(threads)]

    def run(share: list[int]) -> list[tuple[int, R]]:
        return [(i, fn(items[i])) for i in share]

    futures = [_helpers(threads - 1).submit(run, share) for share in shares[1:]]
    done = run(shares[0])
    _, pending = cf.wait(futures, timeout=WAIT_S)
    if pending:
        caller = threading.current_thread().name
        raise TimeoutError(f"a batch's ID work: the calling thread ({caller}) waited "
                           f"{WAIT_S:.0f} s for {len(pending)} of the cosparse-prep threads' "
                           f"shares of its tables")
    for f in futures:
        done.extend(f.result())  # (re-raises a share's error here, in the caller)
    out: list[R | None] = [None] * len(items)
    for i, r in done:
        out[i] = r
    return out  # type: ignore[return-value]
