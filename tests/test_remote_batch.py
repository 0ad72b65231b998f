"""RemoteBatch: during a plan, every table's PS write-backs go out in one round trip and every
table's misses in another; outside a plan, calls go straight through."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from cosparse.store.remote_batch import RemoteBatch


class Recorder:
    """A remote that records the calls it gets, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def pull(self, table, ids, with_state=False, peek=False):
        self.calls.append(("pull", table, ids.tolist()))
        return SimpleNamespace(rows=np.ones((ids.shape[0], 2), np.float32) * ids[:, None])

    def push_rows(self, table, ids, rows):
        self.calls.append(("push_rows", table, ids.tolist(), rows.tolist()))

    def pull_many(self, asks, with_state=False, peek=False):
        self.calls.append(("pull_many", [(t, i.tolist()) for t, i in asks], with_state, peek))
        return [SimpleNamespace(rows=np.ones((i.shape[0], 2), np.float32) * i[:, None])
                for _, i in asks]

    def push_rows_many(self, writes):
        self.calls.append(("push_rows_many", [(t, i.tolist(), r.tolist()) for t, i, r in writes]))

    def dump(self, table):
        return np.zeros(0, np.int64), np.zeros((0, 2), np.float32)


def test_outside_a_plan_calls_go_straight_through():
    r = Recorder()
    b = RemoteBatch(r)
    b.push_rows("t", np.array([1]), np.zeros((1, 2), np.float32))
    assert not b.pull_later("t", np.array([2]), lambda got: None)
    b.pull("t", np.array([3]))
    assert [c[0] for c in r.calls] == ["push_rows", "pull"]


def test_a_plan_sends_its_writes_then_its_pulls_once_each_then_runs_the_callbacks():
    r = Recorder()
    queued = []
    b = RemoteBatch(r, on_queued=lambda t, ids: queued.append((t, ids.tolist())))
    b.begin()
    rows = np.full((2, 2), 5.0, np.float32)
    b.push_rows("a", np.array([7, 8]), rows)
    rows[:] = -1.0  # the slot is reused before the flush: the queued copy must not change
    b.push_rows("b", np.array([9]), np.zeros((1, 2), np.float32))
    got, order = {}, []
    assert b.pull_later("a", np.array([1, 2]), lambda res: (got.update(a=res.rows), order.append("a")))
    assert b.pull_later("b", np.array([3]), lambda res: (got.update(b=res.rows), order.append("b")))
    b.after(lambda: order.append("after"))
    assert r.calls == [] and queued == [("a", [7, 8]), ("b", [9])]
    b.flush()
    assert [c[0] for c in r.calls] == ["push_rows_many", "pull_many"]
    assert r.calls[0][1] == [("a", [7, 8], [[5.0, 5.0], [5.0, 5.0]]), ("b", [9], [[0.0, 0.0]])]
    assert r.calls[1] == ("pull_many", [("a", [1, 2]), ("b", [3])], True, False)
    assert order == ["a", "b", "after"]
    assert np.array_equal(got["a"][:, 0], [1, 2]) and np.array_equal(got["b"][:, 0], [3])
    assert not b.is_open  # the flush closed it
    b.flush()  # nothing queued: nothing sent
    assert len(r.calls) == 2


def test_a_failed_flush_still_closes_the_batch():
    class Down(Recorder):
        def pull_many(self, asks, with_state=False, peek=False):
            raise ConnectionError("PS down")

    b = RemoteBatch(Down())
    b.begin()
    b.pull_later("t", np.array([1]), lambda res: None)
    with pytest.raises(ConnectionError):
        b.flush()
    assert not b.is_open and not b.pull_later("t", np.array([1]), lambda res: None)


def test_queued_write_backs_stay_pending_until_the_ps_has_acknowledged_them():
    """A checkpoint's export reads the tiers, then ``pending``, then the PS: a row in flight
    between the two must show in one of them."""
    seen_during_send = []

    class Slow(Recorder):
        def push_rows_many(self, writes):  # while the PS applies them, they are still pending
            seen_during_send.append(b.pending("a")[0].tolist())
            super().push_rows_many(writes)

    b = RemoteBatch(Slow())
    assert b.pending("a") is None
    b.begin()
    b.push_rows("a", np.array([5, 3]), np.array([[1, 1], [2, 2]], np.float32))
    b.push_rows("b", np.array([4]), np.zeros((1, 2), np.float32))
    b.push_rows("a", np.array([5]), np.array([[9, 9]], np.float32))  # written back again
    ids, rows = b.pending("a")
    assert ids.tolist() == [3, 5] and rows.tolist() == [[2, 2], [9, 9]]  # the newest copy
    b.flush()
    assert seen_during_send == [[3, 5]]
    assert b.pending("a") is None and b.pending("b") is None
