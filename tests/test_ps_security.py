"""PS shards under hostile input, with real `cosparse ps serve` processes (issue 11, defects 2-4):
a message that crashed a shard, replayed HMAC frames, and unbounded requests."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
from ps_raw import RawPeer

from cosparse.config import OptimizerConfig, TableConfig
from cosparse.ps import EmbeddedShards, PSAuthError, PSClient, PSError, shard_of
from cosparse.ps import protocol as P

SGD = TableConfig("sgd", dim=8, optimizer=OptimizerConfig(kind="sgd", lr=0.1), seed=1)
ADAM = TableConfig("adam", dim=4, optimizer=OptimizerConfig(kind="adam", lr=0.01), seed=3)


def _alive(sh: EmbeddedShards) -> bool:
    return all(p.poll() is None for p in sh.procs)


def _owned(n: int, shard: int, num_shards: int, start: int = 0) -> np.ndarray:
    ids = np.arange(start, start + 8 * n + 64, dtype=np.int64)
    return ids[shard_of(ids, num_shards) == shard][:n]


# --- defect 2: a 59-byte message killed a shard --------------------------------------------------
def test_the_59_byte_pull_gets_an_error_reply_and_the_shard_keeps_serving(tmp_path):
    head = P.HEADER.pack(P.MAGIC, P.VERSION, P.OP_PULL, 0, 41, 0, 0, 1, 0)
    frames = [head + P.DESC.pack(2, 2, 2**60, 0), b"sgd", b""]  # int64, shape (2^60, 0)
    assert sum(len(f) for f in frames) == 59
    with EmbeddedShards(1, [SGD], tmp_path) as sh, sh.client(timeout_s=10) as c:
        with RawPeer(sh.endpoints[0]) as raw:
            for _ in range(3):  # again and again: every one answered
                raw.send(frames)
                rep = raw.recv()
                assert rep is not None, "no reply: the shard died or hung"
                assert rep.flags & P.FLAG_REPLY and rep.error == P.E_BAD_FRAME
                assert rep.request_id == 41 and "out of bounds" in rep.text
            assert raw.request(P.Message(P.OP_PING)).error == P.E_OK  # same connection still works
        assert _alive(sh)
        assert c.pull("sgd", np.arange(10, dtype=np.int64)).rows.shape == (10, 8)


# --- defect 3: replayed HMAC frames ---------------------------------------------------------------
def _op(frames: list[bytes]) -> int:
    return frames[0][5]  # the header's op code


class _Recording(PSClient):
    """A real client that keeps a copy of every message it sends (what a wiretap would see)."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.sent: list[tuple[int, list[bytes]]] = []

    def _send(self, i: int, frames: list, wait_s: float) -> None:
        self.sent.append((i, [bytes(f) for f in frames]))
        super()._send(i, frames, wait_s)


@pytest.fixture()
def hmac_shards(tmp_path):
    key_file = tmp_path / "hmac.key"
    key_file.write_bytes(os.urandom(32).hex().encode())
    with EmbeddedShards(1, [SGD], tmp_path / "ps", auth_key_file=key_file) as sh:
        yield sh, key_file.read_bytes().strip()
    assert not _alive(sh)


def test_a_captured_push_replayed_from_a_new_connection_is_refused(hmac_shards):
    sh, key = hmac_shards
    ids = np.arange(100, 110, dtype=np.int64)
    with _Recording(sh.endpoints, timeout_s=10, auth_key=key) as a:
        a.push("sgd", ids, np.ones((10, 8), np.float32), 1)
        pushes = [f for _, f in a.sent if _op(f) == P.OP_PUSH]
        assert len(pushes) == 1
        captured = pushes[0]
        before = a.pull("sgd", ids, with_state=True)
        assert before.versions.tolist() == [1] * 10

        # 1. the same bytes from a new connection (the attack of the issue)
        with RawPeer(sh.endpoints[0]) as attacker:
            attacker.send(captured)
            rep = attacker.recv()
            assert rep is not None and rep.error in (P.E_SESSION, P.E_AUTH), rep
        # ... also after opening a session of its own (it cannot MAC under it without the key,
        # and the captured MAC is under the victim's session)
        with RawPeer(sh.endpoints[0], key=key) as other:
            other.send(captured)
            rep = other.recv()
            assert rep is not None and rep.error == P.E_AUTH and "HMAC" in rep.text, rep

        # 2. again on the victim's own connection (replayed or reordered): the counter refuses it
        a.socks[0].send_multipart(captured)
        a.socks[0].poll(10_000)
        rep = P.decode(a.socks[0].recv_multipart())
        assert rep.error == P.E_AUTH and "replayed or reordered" in rep.text, rep

        # 3. a second authenticated client: another connection, another session
        with _Recording(sh.endpoints, timeout_s=10, auth_key=key) as b:
            b.ping()
            b.socks[0].send_multipart(captured)
            b.socks[0].poll(10_000)
            rep = P.decode(b.socks[0].recv_multipart())
            assert rep.error == P.E_AUTH and "HMAC" in rep.text, rep

        after = a.pull("sgd", ids, with_state=True)  # the victim's session still works
        assert after.versions.tolist() == [1] * 10  # not applied a second time
        assert np.array_equal(after.rows, before.rows)


def test_a_keyed_client_refuses_a_shard_without_the_key(tmp_path):
    key_file = tmp_path / "hmac.key"
    key_file.write_bytes(os.urandom(32).hex().encode())
    with EmbeddedShards(1, [SGD], tmp_path / "plain") as plain, \
            PSClient(plain.endpoints, timeout_s=10, auth_key=key_file) as c, \
            pytest.raises(PSAuthError, match="not authenticated"):
        c.pull("sgd", np.arange(5, dtype=np.int64))  # it cannot answer in a session


def _serve(tmp_path, key_file, bind: str) -> tuple[subprocess.Popen, str]:
    ready = tmp_path / f"ready-{bind.replace(':', '_')}"
    proc = subprocess.Popen([sys.executable, "-m", "cosparse.cli", "ps", "serve", "--shard", "0",
                             "--num-shards", "1", "--bind", bind, "--data-dir", str(tmp_path / "d"),
                             "--auth-key", str(key_file), "--ready-file", str(ready),
                             "--parent-pid", str(os.getpid())],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    for _ in range(1200):
        if ready.exists() or proc.poll() is not None:
            break
        time.sleep(0.05)
    assert ready.exists(), f"shard did not start (exit code {proc.poll()})"
    return proc, ready.read_text().strip()


def test_a_client_opens_a_new_session_when_the_shard_lost_it(tmp_path):
    """A shard restarted on the same endpoint knows no session: the client's next request gets
    E_SESSION (nothing applied), opens a new session and sends it again, transparently."""
    key_file = tmp_path / "hmac.key"
    key_file.write_bytes(os.urandom(32).hex().encode())
    ids = np.arange(5, dtype=np.int64)
    procs = []
    try:
        proc, ep = _serve(tmp_path, key_file, "127.0.0.1:0")
        procs.append(proc)
        with _Recording([ep], timeout_s=10, heartbeat_s=0.5, auth_key=key_file) as c:
            c.register([SGD])
            c.push("sgd", ids, np.ones((5, 8), np.float32), 1)
            c.snapshot()
            old = c.sessions[0]
            proc.terminate()
            proc.wait(10)
            proc, ep2 = _serve(tmp_path, key_file, ep.rsplit("/", 1)[1])  # same port, restored
            procs.append(proc)
            assert ep2 == ep
            time.sleep(1.0)  # the client reconnects (its connection dropped with the old shard)
            c.sessions[0] = old  # as if the drop had not been seen yet: the shard must refuse it
            got = c.pull("sgd", ids)
            assert got.versions.tolist() == [1] * 5
            assert c.sessions[0] not in (None, old)
            ops = [_op(f) for _, f in c.sent[-3:]]
            assert ops == [P.OP_PULL, P.OP_HELLO, P.OP_PULL]  # refused, new session, again
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)


# --- defect 4: unbounded client input -------------------------------------------------------------
LIMITS = ["--max-request-rows", "5000", "--max-message-bytes", str(2 << 20), "--max-dim", "64",
          "--max-tables", "3"]


def test_shard_limits_refuse_what_is_over_them_and_name_the_option(tmp_path):
    with EmbeddedShards(1, [SGD], tmp_path, max_rows=1000, extra_args=LIMITS) as sh, \
            sh.client(timeout_s=10) as c, RawPeer(sh.endpoints[0]) as raw:
        # rows per request (a raw request: the client would split it)
        rep = raw.request(P.Message(P.OP_PULL, text="sgd", arrays=[np.arange(5001, dtype=np.int64)]))
        assert rep.error == P.E_LIMIT and "--max-request-rows" in rep.text and "5001" in rep.text
        # the row budget: 800 rows fit, 300 more do not, and none of them is created
        c.pull("sgd", np.arange(400, dtype=np.int64))
        c.pull("sgd", np.arange(400, 800, dtype=np.int64))
        with pytest.raises(PSError, match=r"shard 0's row budget is full: it holds 800 of 1000 rows"
                                          r".*300 new rows.*--max-rows") as ei:
            c.pull("sgd", np.arange(800, 1100, dtype=np.int64))
        assert ei.value.code == P.E_FULL and sh.endpoints[0] in str(ei.value)
        assert c.stats()[0]["rows"] == 800
        assert c.pull("sgd", np.arange(800, 1100, dtype=np.int64), peek=True).rows.shape == (300, 8)
        c.pull("sgd", np.arange(800, 1000, dtype=np.int64))  # exactly to the budget
        # table shape and count
        with pytest.raises(PSError, match="dim 65 is over shard 0's limit of 64.*--max-dim"):
            c.register([TableConfig("wide", dim=65)])
        with pytest.raises(PSError, match="table 'b1': optimizer.beta1 must be in \\[0, 1\\)"):
            c.register([TableConfig("b1", optimizer=OptimizerConfig(kind="adam", beta1=1.0))])
        wide = TableConfig("wide", dim=64, optimizer=OptimizerConfig(kind="adam"))
        c.register([wide, TableConfig("t3", dim=4)])
        with pytest.raises(PSError, match="limit of 3.*--max-tables"):
            c.register([TableConfig("t4", dim=4)])
        # a PULL whose reply would pass the message limit (4000 rows of 3 * 64 floats)
        rep = raw.request(P.Message(P.OP_PULL, flags=P.FLAG_WITH_STATE | P.FLAG_PEEK, text="wide",
                                    arrays=[np.arange(4000, dtype=np.int64)]))
        assert rep.error == P.E_LIMIT and "3072000-byte reply" in rep.text, rep
        # ... which the client splits, knowing the table's width (REGISTER) and the shard's limit
        before = c.stats()[0]["requests"]
        got = c.pull("wide", np.arange(4000, dtype=np.int64), with_state=True, peek=True)
        assert got.rows.shape == (4000, 192)
        assert c.stats()[0]["requests"] - before == 4  # PING (its limits), 2 PULLs, STATS
        # message size: every frame under the limit, all together over it -> an error reply
        n = 32_000
        rows = np.zeros((n, 16), np.float32)
        assert rows.nbytes < 2 << 20 < rows.nbytes + 8 * n
        rep = raw.request(P.Message(P.OP_PUSH_ROWS, text="sgd",
                                    arrays=[np.arange(n, dtype=np.int64), rows]))
        assert rep.error == P.E_LIMIT and "--max-message-bytes" in rep.text
        # one frame over it: ZeroMQ drops that connection unread; the shard keeps serving
        with RawPeer(sh.endpoints[0], timeout_s=2) as big:
            big.send([b"x" * ((2 << 20) + 1)])
            assert big.recv() is None
        assert _alive(sh) and raw.request(P.Message(P.OP_PING)).error == P.E_OK
        assert c.pull("sgd", np.arange(10, dtype=np.int64)).rows.shape == (10, 8)


def test_non_finite_gradients_and_rows_are_refused_naming_the_table(tmp_path):
    ids = _owned(6, 0, 1)
    with EmbeddedShards(1, [ADAM], tmp_path) as sh, sh.client(timeout_s=10) as c:
        c.push("adam", ids, np.ones((6, 4), np.float32), 1)
        before = c.pull("adam", ids, with_state=True)
        for bad in (np.nan, np.inf, -np.inf):
            g = np.ones((6, 4), np.float32)
            g[3, 2] = bad
            with pytest.raises(PSError, match=r"table 'adam': refused gradients with NaN or "
                                              rf"infinite values in 1 of 6 rows \(e.g. ID {ids[3]}\)"
                               ) as ei:
                c.push("adam", ids, g, 2)
            assert ei.value.code == P.E_NONFINITE  # its own code: the run exits 8, naming it
            rows = before.rows.copy()
            rows[0, 0] = bad
            with pytest.raises(PSError, match="table 'adam': refused rows with NaN"):
                c.push_rows("adam", ids, rows)
        after = c.pull("adam", ids, with_state=True)
        assert np.array_equal(after.rows, before.rows)  # nothing was applied
        assert np.array_equal(after.versions, before.versions)


def test_large_requests_are_split_to_fit_each_shards_limits(tmp_path):
    n = 10_000  # about 5000 rows per shard, over their --max-request-rows
    ids = np.random.default_rng(0).permutation(np.arange(n, dtype=np.int64) * 7919)
    with EmbeddedShards(2, [SGD], tmp_path, extra_args=["--max-request-rows", "4096"]) as sh, \
            sh.client(timeout_s=20) as c:
        rows = np.arange(n * 8, dtype=np.float32).reshape(n, 8)
        before = [s["requests"] for s in c.stats()]
        c.push_rows("sgd", ids, rows)
        # per shard: one PING for its limits, two PUSH_ROWS, and this STATS
        assert [s["requests"] - b for s, b in zip(c.stats(), before, strict=True)] == [4, 4]
        got = c.pull("sgd", ids)
        assert np.array_equal(got.rows, rows)
        wc = c.push("sgd", ids, np.ones((n, 8), np.float32), 1)
        assert set(wc) == {0, 1}
        assert c.pull("sgd", ids).versions.tolist() == [2] * n  # every row written twice


def test_ps_serve_refuses_a_bad_limit(tmp_path):
    r = subprocess.run([sys.executable, "-m", "cosparse.cli", "ps", "serve", "--shard", "0",
                        "--num-shards", "1", "--data-dir", str(tmp_path), "--max-rows", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--max-rows" in r.stderr and "positive" in r.stderr
