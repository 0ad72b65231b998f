"""The PS fuzz suite's memory bounds: a real `cosparse ps serve` shard against hostile peers
(issue 31, items 3 and 5; the hostile messages are ``test_ps_fuzz.py``'s, the shard's state
``test_ps_fuzz_state.py``'s).

* A peer that sends large frames with ZeroMQ's MORE flag and never ends its message holds at most
  ``--max-message-bytes``: past it the rest is read and thrown away, and past twice it the
  connection is dropped; the shard's resident memory does not grow with what it sent.
* Several such peers together are held to ``--max-pending-bytes``.
* A slow reader that sends many PULLs with large replies and reads none gets at most
  ``--max-queued-reply-bytes`` (plus one reply) queued; its requests wait (counted as
  ``backpressured``); its queue is freed when it disconnects, and it is dropped when its queue
  makes no progress for ``--stall-timeout-s``.

A legitimate client keeps working throughout. Sizes are small (a 2 MiB message limit) so each
test takes a few seconds.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import zmq
from ps_raw import RawPeer, RawZmtpPeer

from cosparse.config import OptimizerConfig, TableConfig
from cosparse.ps import EmbeddedShards
from cosparse.ps import protocol as P

MIB = 1 << 20
MAX_MESSAGE = P.MIN_MESSAGE_LIMIT  # 2 MiB
MAX_PENDING = 4 * MIB
MAX_QUEUED = 4 * MIB
STALL_S = 2.0
TABLES = [TableConfig("sgd", dim=8, optimizer=OptimizerConfig(kind="sgd", lr=0.1), seed=1)]
PULL_ROWS = 40_000  # a 1.6 MB reply (rows and versions)


@pytest.fixture(scope="module", params=["plain", "hmac"])
def shard(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"bounds-{request.param}")
    key_file = None
    if request.param == "hmac":
        key_file = tmp / "hmac.key"
        key_file.write_bytes(os.urandom(32).hex().encode())
    sh = EmbeddedShards(1, TABLES, tmp / "ps", auth_key_file=key_file, extra_args=[
        "--max-message-bytes", str(MAX_MESSAGE), "--max-pending-bytes", str(MAX_PENDING),
        "--max-queued-reply-bytes", str(MAX_QUEUED), "--stall-timeout-s", str(STALL_S)])
    client = sh.client(timeout_s=20)
    try:
        yield sh, client
    finally:
        client.close()
        sh.close()
    assert all(p.poll() is not None for p in sh.procs)


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _transport(client) -> dict:
    return client.stats()[0].get("transport", {})


def _wait_for(client, check, timeout_s: float = 8.0) -> dict:
    """The shard's transport counters once ``check(counters)`` holds (or at the deadline)."""
    deadline = time.monotonic() + timeout_s
    while True:
        st = _transport(client)
        if check(st) or time.monotonic() > deadline:
            return st
        time.sleep(0.05)


def _legit(client) -> None:
    ids = np.arange(-50, 50, dtype=np.int64)
    got = client.pull("sgd", ids)
    assert got.rows.shape == (100, 8) and np.isfinite(got.rows).all()


def _peer(ctx: zmq.Context, endpoint: str, **opts: int) -> zmq.Socket:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RECONNECT_IVL, -1)  # a dropped peer stays dropped
    for k, v in opts.items():
        s.setsockopt(getattr(zmq, k), v)
    s.connect(endpoint)
    return s


def _drops(st: dict, reason: str) -> int:
    return st.get("dropped_connections", {}).get(reason, 0)


def test_an_endless_multipart_message_drops_its_connection(shard):
    sh, client = shard
    _legit(client)
    pid = sh.pids[0]
    before, rss0 = _transport(client), _rss(pid)
    peer = RawZmtpPeer(sh.endpoints[0])
    try:
        frame = b"\x01" * MIB
        sent = 0
        while sent < 32 and peer.send_frame(frame):  # up to 32 MiB, never ended
            sent += 1
        st = _wait_for(client, lambda st: _drops(st, "message_bytes") > _drops(before,
                                                                               "message_bytes"))
        grew = _rss(pid) - rss0
        _legit(client)
    finally:
        peer.close()
    assert _drops(st, "message_bytes") == _drops(before, "message_bytes") + 1, st
    assert grew < 8 * MIB, f"the shard grew by {grew / MIB:.0f} MiB"
    assert st["pending_request_bytes"] <= MAX_MESSAGE


def test_incomplete_messages_of_many_peers_are_held_to_the_total_cap(shard):
    sh, client = shard
    pid = sh.pids[0]
    before, rss0 = _transport(client), _rss(pid)
    peers = [RawZmtpPeer(sh.endpoints[0]) for _ in range(5)]
    try:
        part = b"\x02" * (MAX_MESSAGE * 3 // 4)  # each peer under the per-message limit
        for p in peers:
            p.send_frame(part)
        st = _wait_for(client, lambda st: _drops(st, "pending_bytes") > _drops(before,
                                                                               "pending_bytes"))
        held, grew = st["pending_request_bytes"], _rss(pid) - rss0
        _legit(client)  # its request still fits beside them
        # peers that stop sending mid-message are dropped after --stall-timeout-s
        after = _wait_for(client, lambda st: st["pending_request_bytes"] == 0, 3 * STALL_S)
    finally:
        for p in peers:
            p.close()
    assert _drops(st, "pending_bytes") - _drops(before, "pending_bytes") >= 1, st
    assert 0 < held <= MAX_PENDING, st
    assert grew < 8 * MIB, f"the shard grew by {grew / MIB:.0f} MiB"
    assert after["pending_request_bytes"] == 0 and _drops(after, "request_stalled") >= 1, after
    _legit(client)


def _slow_reader(ctx: zmq.Context, endpoint: str, key: bytes | None, n: int) -> zmq.Socket:
    """A peer that sends ``n`` PULLs with large replies and reads none (its receive queue
    holds one message, its socket buffer 64 KiB)."""
    s = _peer(ctx, endpoint, RCVHWM=1, RCVBUF=1 << 16)
    session = b""
    if key is not None:
        nonce = os.urandom(P.NONCE_BYTES)
        s.send_multipart(P.encode(P.Message(P.OP_HELLO, request_id=1, arrays=[
            np.frombuffer(nonce, dtype=np.uint8)]), key))
        assert s.poll(10_000), "no HELLO reply"
        session = P.decode(s.recv_multipart(), key, nonce).arrays[0].tobytes()
    ids = np.arange(PULL_ROWS, dtype=np.int64)
    for i in range(n):
        s.send_multipart(P.encode(P.Message(P.OP_PULL, request_id=2 + i, text="sgd",
                                            arrays=[ids]), key, session), copy=False)
    return s


def test_a_slow_reader_gets_a_bounded_reply_queue(shard):
    sh, client = shard
    pid = sh.pids[0]
    _legit(client)
    client.pull("sgd", np.arange(PULL_ROWS, dtype=np.int64))  # the reply buffers exist
    before, rss0 = _transport(client), _rss(pid)
    key = client.key if hasattr(client, "key") else None
    ctx = zmq.Context()
    try:
        slow = _slow_reader(ctx, sh.endpoints[0], key, 40)  # 64 MB of replies, never read
        st = _wait_for(client, lambda st: st.get("backpressured", 0) > before.get(
            "backpressured", 0) and st["queued_reply_bytes"] > 0)
        time.sleep(0.5)
        st, grew = _transport(client), _rss(pid) - rss0
        _legit(client)
        slow.close(0)  # its queue is freed at once
        gone = _wait_for(client, lambda st: st["queued_reply_bytes"] == 0
                         and st["connections"] == before["connections"])
        stalled = _slow_reader(ctx, sh.endpoints[0], key, 40)
        dropped = _wait_for(client, lambda st: _drops(st, "reply_stalled")
                            > _drops(before, "reply_stalled"), 4 * STALL_S)
        _legit(client)
        stalled.close(0)
    finally:
        ctx.destroy(0)
    assert st["backpressured"] > before["backpressured"], st
    assert 0 < st["queued_reply_bytes"] <= MAX_QUEUED + MAX_MESSAGE, st
    assert grew < 24 * MIB, f"the shard grew by {grew / MIB:.0f} MiB"
    assert gone["queued_reply_bytes"] == 0, gone
    assert _drops(dropped, "reply_stalled") == _drops(before, "reply_stalled") + 1, dropped
    assert dropped["queued_reply_bytes"] == 0, dropped


def test_a_reply_with_empty_arrays_goes_out(shard):
    """(The transport sends each array frame as raw bytes: a (0, dim) array is an empty frame.)"""
    sh, client = shard
    with RawPeer(sh.endpoints[0], key=client.key, timeout_s=10) as raw:
        rep = raw.request(P.Message(P.OP_PULL, text="sgd", arrays=[np.zeros(0, np.int64)]))
    assert rep is not None and rep.error == P.E_OK, rep
    assert rep.arrays[0].shape == (0, 8) and rep.arrays[1].shape == (0,)
