"""A shard compiles its kernels before it says it is ready.

numba compiles a kernel on its first call (or loads it from the cache that
``cosparse.numba_cache`` keys by the sources' digest). Without a warm-up that first call is a
client's first PULL or PUSH: with a cold cache on a busy machine it took over a minute, while the
client's request timeout is seconds, so the first requests of a healthy shard timed out.
``warm_up_kernels`` runs every table operation of every optimizer once, on a scratch shard of
tiny tables, so that a shard which has written its ready file answers at its serving speed.

``ensure_warm`` does that only while the cache folder has no mark of a finished warm-up (a new
folder after any change to the sources: ``cosparse.numba_cache``); once one has run, the cached
kernels load in milliseconds on first use, and a shard starts without the warm-up's cost.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from cosparse.config import OptimizerConfig, TableConfig
from cosparse.ps.shard import Shard

MARK = "ps-kernels-warm"  # in numba's cache folder, once a warm-up has compiled the kernels
OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad", "adam")  # (config.tables' kinds)


def warm_up_kernels(threads: int = 1) -> float:
    """Run every shard kernel once on scratch tables; returns the seconds it took."""
    t0 = time.perf_counter()
    shard = Shard(0, 1, threads=threads)
    tables = [TableConfig(name=f"warm_{kind}", dim=4, optimizer=OptimizerConfig(kind=kind))
              for kind in OPTIMIZERS]
    shard.register(tables)
    for readonly in (False, True):  # (arrays read off the wire are read-only: numba types
        # them apart, and a kernel first compiled at a client's request timed it out)
        ids = _array(np.arange(1, 9, dtype=np.int64), readonly)
        grads = _array(np.full((len(ids), 4), 0.01, np.float32), readonly)
        for t in tables:
            shard.pull(t.name, ids)
            shard.push(t.name, ids, grads, 1)
            shard.pull(t.name, ids, with_state=True)
            rows = np.zeros((len(ids), shard.table(t.name).width), np.float32)
            shard.push_rows(t.name, ids, _array(rows, readonly))
            shard.dump(t.name)
    return time.perf_counter() - t0


def _array(a: np.ndarray, readonly: bool) -> np.ndarray:
    if readonly:
        a.setflags(write=False)
    return a


def mark_of(threads: int) -> str:
    """The mark of a warm-up of a shard of ``threads`` threads: one of one thread compiles the
    serial kernels, one of more the parallel ones (``ShardTable.threads``)."""
    return MARK if threads <= 1 else f"{MARK}-parallel"


def ensure_warm(threads: int = 1) -> float | None:
    """``warm_up_kernels`` unless the cache folder says one has run for these sources and this
    kind of shard (serial or parallel kernels); returns its seconds, or None when it was not
    needed (or there is no cache folder to mark)."""
    folder = os.environ.get("NUMBA_CACHE_DIR")
    mark = mark_of(threads)
    if not folder or (Path(folder) / mark).exists():
        return None
    took = warm_up_kernels(threads)
    try:
        (Path(folder) / mark).write_text(f"{took:.3f}\n")
    except OSError:  # (a read-only cache: the next shard warms up again)
        pass
    return took
