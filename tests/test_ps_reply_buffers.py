"""``ReplyBuffers``: a PULL reply's buffer is never handed out while a view of it (a reply that
ZeroMQ has not sent yet) lives, and is reused once none does; the pool stays bounded."""

from __future__ import annotations

import numpy as np

from cosparse.ps.reply_buffers import ReplyBuffers


def test_a_buffer_in_use_is_not_reused_and_a_released_one_is() -> None:
    pool = ReplyBuffers(keep=4)
    a = pool.take(100_000)
    rows = a[8:].view(np.float32)  # what the reply frames hold
    del a
    b = pool.take(90_000)
    assert b.base is not rows.base and b.nbytes == 90_000
    first = id(rows.base)  # (the pool keeps it alive: the id stays its own)
    del rows
    c = pool.take(120_000)  # same power-of-two size class: the released buffer again
    assert id(c.base) == first and pool.reused == 1 and pool.allocated == 2
    del b, c


def test_the_pool_is_bounded() -> None:
    pool = ReplyBuffers(keep=2)
    held = [pool.take(1 << k) for k in range(17, 22)]
    assert len(pool.pool) == 2 and pool.allocated == 5
    assert all(h.nbytes == 1 << k for h, k in zip(held, range(17, 22), strict=True))


def test_forgetting_the_smallest_buffer_anywhere_in_the_pool() -> None:
    """The smallest buffer is not the first one: forgetting it must not compare arrays (issue
    31: ``list.remove`` broadcast a 1 MiB buffer against a 128 KiB one and failed the PULL)."""
    pool = ReplyBuffers(keep=2)
    held = [pool.take(1 << 20), pool.take(1 << 17), pool.take(1 << 18)]
    assert sorted(b.nbytes for b in pool.pool) == [1 << 18, 1 << 20]
    held += [pool.take(1 << 19), pool.take(1 << 16)]
    assert len(pool.pool) == 2 and pool.allocated == 5
    del held
