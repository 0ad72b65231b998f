"""ReplyBuffers: byte buffers for the shard's PULL replies, reused once ZeroMQ is done with them.

A reply's rows are written by the pull kernel straight into a buffer that ZeroMQ then sends
without a copy (``copy=False``): pyzmq holds a reference to the buffer until libzmq has sent it.
A fresh buffer per reply costs the allocator's page faults (a reply is around a megabyte, so it
is mapped and unmapped each time); here a buffer is taken again only when nothing but the pool
refers to it any more (``sys.getrefcount``), i.e. when its last reply has left. Sizes are
rounded up to a power of two so that replies of varying sizes reuse the same buffers; at most
``keep`` buffers are kept.
"""

from __future__ import annotations

import sys

import numpy as np

_MIN_BYTES = 1 << 16


class ReplyBuffers:
    """A small pool of reusable reply buffers (one thread uses it: the serving loop's)."""

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self.pool: list[np.ndarray] = []
        self.reused = 0
        self.allocated = 0

    def take(self, nbytes: int) -> np.ndarray:
        """A uint8 array of ``nbytes`` (a view of a pooled buffer that no reply still uses)."""
        for i in range(len(self.pool)):
            # references: the pool's list, and getrefcount's argument
            if self.pool[i].nbytes >= nbytes and sys.getrefcount(self.pool[i]) <= 2:
                self.reused += 1
                return self.pool[i][:nbytes]
        buf = np.empty(max(_MIN_BYTES, 1 << max(0, nbytes - 1).bit_length()), dtype=np.uint8)
        self.allocated += 1
        self.pool.append(buf)
        if len(self.pool) > self.keep:  # forget the smallest (it is freed once its reply left)
            # by position: ``list.remove`` would compare the arrays with ``==`` (elementwise)
            del self.pool[min(range(len(self.pool)), key=lambda i: self.pool[i].nbytes)]
        return buf[:nbytes]
