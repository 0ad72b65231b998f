"""PSClient: the sharded parameter-server client (one ZeroMQ DEALER socket per shard).

``pull`` and ``push`` split a batch of IDs by owning shard (``mix64(id) % N``), send one request to
every shard involved before waiting for any reply (all shards work in parallel, many requests in
flight), and reassemble the replies in the original order with batched numpy indexing.

Failure detection never waits forever:

* every wait is a ``zmq.Poller`` slice bounded by the request timeout (``timeout_s``);
* ZeroMQ heartbeats (ZMTP PING/PONG every ``heartbeat_s``, answered by the peer's I/O thread even
  while the shard is busy) drop a dead connection, and a socket monitor reports it at once: a
  request in flight on a lost connection, or a shard down for more than ``3 * heartbeat_s``, raises
  ``PSUnavailable`` naming the shard index and endpoint, independently of the request timeout;
* an optional ``watch`` callable (``EmbeddedShards.check``) is called on every slice, so a dead
  embedded process is reported by its process watch too.

Every byte sent and received on the sockets (headers included) is counted in ``bytes_pull``
(PULL) and ``bytes_push`` (PUSH, PUSH_ROWS), others in ``bytes_other``.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from cosparse.config import TableConfig
from cosparse.link import LinkShaper
from cosparse.ps import protocol as P


class PSError(RuntimeError):
    """A shard answered with an error."""

    def __init__(self, shard: int, endpoint: str, code: int, message: str) -> None:
        super().__init__(f"PS shard {shard} at {endpoint}: {P.ERROR_NAMES.get(code, code)}: {message}")
        self.shard, self.endpoint, self.code = shard, endpoint, code


class PSAuthError(PSError):
    """A shard refused the request's credentials."""


class PSUnavailable(RuntimeError):
    """A shard is dead or did not answer in time."""

    def __init__(self, shard: int, endpoint: str, reason: str) -> None:
        super().__init__(f"PS shard {shard} at {endpoint} is unavailable: {reason}")
        self.shard, self.endpoint, self.reason = shard, endpoint, reason


@dataclass
class PullResult:
    """Rows (``[n, dim]`` or ``[n, dim + state]``) and versions in the order of the pulled IDs, and
    each shard's write counter at the time of the pull."""

    rows: np.ndarray
    versions: np.ndarray
    write_counters: dict[int, int]


@dataclass
class ClientCounters:
    bytes_pull: int = 0
    bytes_push: int = 0
    bytes_other: int = 0
    requests: int = 0
    wait_s: float = 0.0


_PUSH_OPS = (P.OP_PUSH, P.OP_PUSH_ROWS)
_DOWN_EVENTS = zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
_UP_EVENT = zmq.EVENT_HANDSHAKE_SUCCEEDED
_AUTH_FAIL_EVENTS = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


class PSClient:
    """Client of ``len(endpoints)`` shards; shard ``i`` listens on ``endpoints[i]``.

    ``auth_key``: HMAC shared secret (bytes or a key file path). ``curve``: (client secret key
    file, server public key file) from ``cosparse ps keygen``. ``watch``: called while waiting;
    may raise ``PSUnavailable`` (e.g. ``EmbeddedShards.check``).
    """

    def __init__(
        self,
        endpoints: list[str],
        timeout_s: float = 30.0,
        heartbeat_s: float = 1.0,
        auth_key: bytes | str | Path | None = None,
        curve: tuple[str | Path, str | Path] | None = None,
        watch: Callable[[], None] | None = None,
        link: LinkShaper | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("PSClient needs at least one endpoint")
        self.endpoints = [e if "://" in e else f"tcp://{e}" for e in endpoints]
        self.num_shards = len(self.endpoints)
        self.timeout_s = float(timeout_s)
        self.heartbeat_s = float(heartbeat_s)
        if isinstance(auth_key, (str, Path)):
            from cosparse.ps.server import read_key_file

            auth_key = read_key_file(auth_key)
        self.key = auth_key
        self.watch = watch
        self.link = link  # a simulated link every request and reply crosses (None: unshaped)
        self.counters = ClientCounters()
        self._lock = threading.RLock()
        self._rid = 0
        self.ctx = zmq.Context()
        self.socks: list[zmq.Socket] = []
        self.monitors: list[zmq.Socket] = []
        self.up = [False] * self.num_shards
        self.down_since = [time.monotonic()] * self.num_shards
        self.lost_at = [0.0] * self.num_shards  # last time a connection of shard i dropped
        self.auth_failed = [False] * self.num_shards
        for ep in self.endpoints:
            s = self.ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            ivl = max(1, int(self.heartbeat_s * 1000))
            s.setsockopt(zmq.HEARTBEAT_IVL, ivl)
            s.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * ivl)
            s.setsockopt(zmq.HEARTBEAT_TTL, 3 * ivl)
            s.setsockopt(zmq.RECONNECT_IVL, 100)
            if curve is not None:
                from zmq.auth import load_certificate

                pub, sec = load_certificate(str(curve[0]))
                server_pub, _ = load_certificate(str(curve[1]))
                s.curve_publickey, s.curve_secretkey, s.curve_serverkey = pub, sec, server_pub
            mon = s.get_monitor_socket(_DOWN_EVENTS | _UP_EVENT | _AUTH_FAIL_EVENTS)
            s.connect(ep)
            self.socks.append(s)
            self.monitors.append(mon)
        self.poller = zmq.Poller()
        for s in self.socks:
            self.poller.register(s, zmq.POLLIN)
        for m in self.monitors:
            self.poller.register(m, zmq.POLLIN)

    # --- public API -------------------------------------------------------------------------
    def shard_of(self, ids: np.ndarray) -> np.ndarray:
        return P.shard_of(ids, self.num_shards)

    def register(self, tables: list[TableConfig]) -> None:
        """Declare tables on every shard (a no-op for tables already there with the same config)."""
        text = json.dumps([dataclasses.asdict(t) for t in tables])
        self._call({i: P.Message(P.OP_REGISTER, text=text) for i in range(self.num_shards)})

    def pull(self, table: str, ids: np.ndarray, with_state: bool = False, peek: bool = False
             ) -> PullResult:
        """Rows and versions of ``ids`` (any order, duplicates allowed), in that order.

        ``peek``: unknown IDs read their initial value and are not created (version -1)."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        order, bounds = self._split(ids)
        flags = (P.FLAG_WITH_STATE if with_state else 0) | (P.FLAG_PEEK if peek else 0)
        reqs = {i: P.Message(P.OP_PULL, flags=flags, text=table, arrays=[ids[order[lo:hi]]])
                for i, (lo, hi) in bounds.items()}
        replies = self._call(reqs)
        if not replies:
            return PullResult(np.zeros((0, 0), np.float32), np.zeros(0, np.int64), {})
        width = next(iter(replies.values())).arrays[0].shape[1]
        rows = np.empty((ids.shape[0], width), dtype=np.float32)
        versions = np.empty(ids.shape[0], dtype=np.int64)
        for i, (lo, hi) in bounds.items():
            r = replies[i]
            if r.arrays[0].shape != (hi - lo, width) or r.arrays[1].shape != (hi - lo,):
                raise PSError(i, self.endpoints[i], P.E_BAD_FRAME, "reply has the wrong shape")
            rows[order[lo:hi]] = r.arrays[0]
            versions[order[lo:hi]] = r.arrays[1]
        return PullResult(rows, versions, {i: int(r.arg) for i, r in replies.items()})

    def push(self, table: str, ids: np.ndarray, grads: np.ndarray, step: int) -> dict[int, int]:
        """Apply ``grads`` [n, dim] of unique ``ids`` at 1-based ``step`` on the owning shards;
        returns each involved shard's write counter after the write."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        grads = np.ascontiguousarray(grads, dtype=np.float32)
        order, bounds = self._split(ids)
        reqs = {i: P.Message(P.OP_PUSH, arg=int(step), text=table,
                             arrays=[ids[order[lo:hi]], grads[order[lo:hi]]])
                for i, (lo, hi) in bounds.items()}
        return {i: int(r.arg) for i, r in self._call(reqs).items()}

    def dump(self, table: str) -> tuple[np.ndarray, np.ndarray]:
        """Every row of ``table`` on every shard, with its optimizer state: (ids, rows)."""
        replies = self._call({i: P.Message(P.OP_DUMP, text=table) for i in range(self.num_shards)})
        parts = [replies[i].arrays for i in sorted(replies)]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def push_rows(self, table: str, ids: np.ndarray, rows: np.ndarray) -> dict[int, int]:
        """Overwrite rows with their optimizer state ([n, dim + state]) on the owning shards."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        order, bounds = self._split(ids)
        reqs = {i: P.Message(P.OP_PUSH_ROWS, text=table, arrays=[ids[order[lo:hi]], rows[order[lo:hi]]])
                for i, (lo, hi) in bounds.items()}
        return {i: int(r.arg) for i, r in self._call(reqs).items()}

    def snapshot(self, name: str = "", incremental: bool = False) -> dict[int, str]:
        """Every shard snapshots into its data dir (or the sub-directory ``name``); returns the
        snapshot name per shard."""
        flags = P.FLAG_INCREMENTAL if incremental else 0
        reqs = {i: P.Message(P.OP_SNAPSHOT, flags=flags, text=name) for i in range(self.num_shards)}
        return {i: r.text for i, r in self._call(reqs).items()}

    def stats(self) -> list[dict]:
        """Each shard's STATS: rows, bytes in/out, requests, queue depth, write counter."""
        replies = self._call({i: P.Message(P.OP_STATS) for i in range(self.num_shards)})
        return [json.loads(replies[i].text) for i in range(self.num_shards)]

    def ping(self, timeout_s: float | None = None) -> list[float]:
        """Round-trip seconds of a PING to every shard (``PSUnavailable`` when one is dead)."""
        t0 = time.perf_counter()
        replies = self._call({i: P.Message(P.OP_PING) for i in range(self.num_shards)}, timeout_s)
        return [time.perf_counter() - t0 if i in replies else float("nan")
                for i in range(self.num_shards)]

    def close(self) -> None:
        for s in self.socks:
            s.disable_monitor()
        for m in self.monitors:
            m.close(0)
        for s in self.socks:
            s.close(0)
        self.ctx.term()

    def __enter__(self) -> PSClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals --------------------------------------------------------------------------
    def _split(self, ids: np.ndarray) -> tuple[np.ndarray, dict[int, tuple[int, int]]]:
        owner = self.shard_of(ids)
        order = np.argsort(owner, kind="stable")
        counts = np.bincount(owner, minlength=self.num_shards)
        ends = np.cumsum(counts)
        return order, {i: (int(ends[i] - counts[i]), int(ends[i]))
                       for i in range(self.num_shards) if counts[i]}

    def _count(self, op: int, nbytes: int) -> None:
        if op == P.OP_PULL:
            self.counters.bytes_pull += nbytes
        elif op in _PUSH_OPS:
            self.counters.bytes_push += nbytes
        else:
            self.counters.bytes_other += nbytes

    def _drain_monitor(self, i: int) -> None:
        mon = self.monitors[i]
        while True:
            try:
                ev = recv_monitor_message(mon, zmq.NOBLOCK)
            except zmq.Again:
                return
            e = ev["event"]
            if e & _UP_EVENT:
                self.up[i] = True
                self.auth_failed[i] = False
            elif e & _AUTH_FAIL_EVENTS:
                self.auth_failed[i] = True
            elif e & _DOWN_EVENTS and self.up[i]:
                self.up[i] = False
                self.down_since[i] = self.lost_at[i] = time.monotonic()

    def _call(self, reqs: dict[int, P.Message], timeout_s: float | None = None) -> dict[int, P.Message]:
        # ZeroMQ sockets are not thread-safe: the planner's prefetch pulls and the trainer's
        # pushes share this client, so requests go out one call at a time
        with self._lock:
            return self._call_locked(reqs, timeout_s)

    def _call_locked(
        self, reqs: dict[int, P.Message], timeout_s: float | None = None
    ) -> dict[int, P.Message]:
        """Send every request, then wait for all replies (one per shard)."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        pending: dict[int, tuple[int, int, float]] = {}  # request id -> (shard, op, sent at)
        sent_at = time.time()
        moved0 = self.counters.bytes_pull + self.counters.bytes_push + self.counters.bytes_other
        for i, msg in reqs.items():
            self._rid = (self._rid + 1) & 0xFFFFFFFFFFFFFFFF
            msg.request_id = self._rid
            frames = P.encode(msg, self.key)
            self._send(i, frames, min(timeout, 3 * self.heartbeat_s))
            self._count(msg.op, P.frames_nbytes(frames))
            self.counters.requests += 1
            pending[msg.request_id] = (i, msg.op, time.monotonic())
        replies: dict[int, P.Message] = {}
        t_start = time.monotonic()
        deadline = t_start + timeout
        grace = 3 * self.heartbeat_s
        try:
            while pending:
                now = time.monotonic()
                if now >= deadline:
                    i = next(iter(pending.values()))[0]
                    raise PSUnavailable(i, self.endpoints[i], f"no reply within the request timeout "
                                                              f"of {timeout:g} s")
                events = dict(self.poller.poll(max(1, int(min(deadline - now, 0.05) * 1000))))
                for i, s in enumerate(self.socks):
                    if self.monitors[i] in events:
                        self._drain_monitor(i)
                    if s in events:
                        self._receive(i, s, pending, replies)
                self._check_health(pending, grace)
                if self.watch is not None:
                    self.watch()
            if self.link is not None:  # requests and replies cross the link: two messages
                c = self.counters
                self.link.transfer(c.bytes_pull + c.bytes_push + c.bytes_other - moved0, 2, sent_at)
        finally:
            self.counters.wait_s += time.monotonic() - t_start
        return replies

    def _receive(self, i: int, s: zmq.Socket, pending: dict, replies: dict) -> None:
        while True:
            try:
                frames = s.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.up[i] = True
            try:
                msg = P.decode(frames, None)
            except P.ProtocolError as e:
                raise PSError(i, self.endpoints[i], e.code, f"malformed reply: {e}") from e
            self._count(msg.op, P.frames_nbytes(frames))
            if msg.request_id not in pending:
                continue  # the late reply of a request that already failed
            if msg.error == P.E_AUTH:
                raise PSAuthError(i, self.endpoints[i], msg.error, msg.text)
            if self.key is not None:
                try:
                    msg = P.decode(frames, self.key)  # the reply must carry a valid HMAC
                except P.ProtocolError as e:
                    raise PSAuthError(i, self.endpoints[i], P.E_AUTH, f"reply: {e}") from e
            if msg.error != P.E_OK:
                pending.pop(msg.request_id)
                raise PSError(i, self.endpoints[i], msg.error, msg.text)
            pending.pop(msg.request_id)
            replies[i] = msg

    def _send(self, i: int, frames: list, wait_s: float) -> None:
        """Send to shard ``i``; with no connection yet, wait up to ``wait_s`` for one (a refused
        CURVE handshake is reported as such, not as an unreachable shard)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.socks[i].send_multipart(frames, zmq.NOBLOCK, copy=False)
                return
            except zmq.Again:
                self._drain_monitor(i)
                if self.auth_failed[i]:
                    raise PSAuthError(i, self.endpoints[i], P.E_AUTH, "CURVE handshake refused") from None
                if time.monotonic() > deadline:
                    raise PSUnavailable(i, self.endpoints[i], f"not connected after {wait_s:g} s "
                                                              "(send queue full)") from None
                self.monitors[i].poll(50)

    def _check_health(self, pending: dict, grace: float) -> None:
        now = time.monotonic()
        for shard, _op, sent in pending.values():
            ep = self.endpoints[shard]
            if self.auth_failed[shard]:
                raise PSAuthError(shard, ep, P.E_AUTH, "CURVE handshake refused")
            if self.lost_at[shard] >= sent:
                raise PSUnavailable(shard, ep, "connection lost with a request in flight "
                                               "(heartbeat or disconnect)")
            if not self.up[shard] and now - self.down_since[shard] > grace:
                raise PSUnavailable(shard, ep, f"not connected for {now - self.down_since[shard]:.1f} s "
                                               f"(heartbeat grace {grace:g} s)")
