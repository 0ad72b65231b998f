"""PSClient: the sharded parameter-server client (one ZeroMQ DEALER socket per shard).

``pull`` and ``push`` split a batch of IDs by owning shard (``mix64(id) % N``), send one request to
every shard involved before waiting for any reply (all shards work in parallel, many requests in
flight), and reassemble the replies in the original order with batched numpy indexing. A request
larger than ``CHUNK_ROWS`` rows or about ``CHUNK_BYTES`` bytes goes out as several, all in flight
together; before the first request larger than any shard accepts (``protocol.SMALL_REQUEST_*``)
the client asks each shard for its limits (``ps serve --max-*``, in its PING reply) and splits to
fit them too.

Failure detection never waits forever:

* every wait is a ``zmq.Poller`` slice bounded by the request timeout (``timeout_s``);
* ZeroMQ heartbeats (ZMTP PING/PONG, answered by the peer's I/O thread even while the shard is
  busy) run on a second, idle connection per shard as well as on the data connection: a large
  request that a stopped shard never reads would queue the data connection's PINGs behind it. A
  socket monitor reports every drop at once: a request in flight on a lost connection, or a
  shard whose heartbeat connection is down, raises ``PSUnavailable`` naming the shard index and
  endpoint and how long it has been silent; with ``heartbeat_s: 1`` that is within about 3.5 s
  of the shard's last sign of life, independently of the request timeout;
* an optional ``watch`` callable (``EmbeddedShards.check``) is called on every slice, so a dead
  embedded process is reported by its process watch too.

With an HMAC key, the first request to a shard opens a session (HELLO, see ``protocol``); a
shard that lost it (a new connection, an expired session) answers ``E_SESSION`` without doing
anything, and the client opens a new one and sends the request again.

Every byte sent and received on the sockets (headers included) is counted in ``bytes_pull``
(PULL) and ``bytes_push`` (PUSH, PUSH_ROWS), others in ``bytes_other``.
"""

from __future__ import annotations

import dataclasses
import json
import os
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

CHUNK_ROWS = 1 << 18  # rows per request at most (a shard's default limit is 2^20)
CHUNK_BYTES = 64 << 20  # bytes per request (and PULL reply) at most, about
_OVERHEAD = P.MAX_TEXT + 4096  # a message's header, text and MAC, at most
MAX_SESSION_RETRIES = 3


class PSError(RuntimeError):
    """A shard answered with an error."""

    def __init__(self, shard: int, endpoint: str, code: int, message: str) -> None:
        super().__init__(f"PS shard {shard} at {endpoint}: {P.ERROR_NAMES.get(code, code)}: {message}")
        self.shard, self.endpoint, self.code = shard, endpoint, code


class PSAuthError(PSError):
    """A shard refused the request's credentials."""


class PSUnavailable(RuntimeError):
    """A shard is dead or did not answer in time; ``silence_s``: how long it has been silent
    (None when unknown)."""

    def __init__(self, shard: int, endpoint: str, reason: str, silence_s: float | None = None) -> None:
        super().__init__(f"PS shard {shard} at {endpoint} is unavailable: {reason}")
        self.shard, self.endpoint, self.reason, self.silence_s = shard, endpoint, reason, silence_s


@dataclass
class PullResult:
    """Rows (``[n, dim]`` or ``[n, dim + state]``) and versions in the order of the pulled IDs, and
    each shard's write counter at the time of the pull (the oldest, when it took several requests)."""

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


@dataclass
class _Pending:
    """A request in flight: its index in the call (-1 for HELLO), shard, op, send time and the
    nonce its reply is MACed under."""

    idx: int
    shard: int
    op: int
    sent: float
    session: bytes = b""


_PUSH_OPS = (P.OP_PUSH, P.OP_PUSH_ROWS)
_DOWN_EVENTS = zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
_UP_EVENT = zmq.EVENT_HANDSHAKE_SUCCEEDED
# (a handshake that times out, e.g. to a stopped shard, is HANDSHAKE_FAILED_NO_DETAIL: not auth)
_AUTH_FAIL_EVENTS = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL


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
        self.num_shards = n = len(self.endpoints)
        self.timeout_s = float(timeout_s)
        self.heartbeat_s = float(heartbeat_s)
        # a connection whose PING is unanswered for hb_timeout_s is dropped; the heartbeat
        # connection pings twice per heartbeat_s, so a stopped shard is dropped within
        # heartbeat_s / 2 + hb_timeout_s of its last sign of life
        self.hb_timeout_s = 3 * self.heartbeat_s
        if isinstance(auth_key, (str, Path)):
            from cosparse.ps.server import read_key_file

            auth_key = read_key_file(auth_key)
        self.key = auth_key
        self.watch = watch
        self.link = link  # a simulated link every request and reply crosses (None: unshaped)
        self.counters = ClientCounters()
        self._lock = threading.RLock()
        self._rid = 0
        self.sessions: list[bytes | None] = [None] * n  # HMAC session nonce per shard
        self._widths: dict[tuple[str, bool], int] = {}  # last reply width per (table, with_state)
        self._limits: list[tuple[int, int] | None] = [None] * n  # (message bytes, request rows)
        self.ctx = zmq.Context()
        self.socks: list[zmq.Socket] = []
        self.monitors: list[zmq.Socket] = []
        self.hb_socks: list[zmq.Socket] = []
        self.hb_monitors: list[zmq.Socket] = []
        now = time.monotonic()
        self.up = [False] * n
        self.down_since = [now] * n
        self.lost_at = [0.0] * n  # last time a data connection of shard i dropped
        self.hb_up = [False] * n
        self.hb_lost_at = [0.0] * n  # last time the heartbeat connection of shard i dropped
        self.last_reply = [0.0] * n  # last time anything arrived from shard i
        self.refused = [False] * n  # since its last drop, shard i's endpoint refused a reconnect
        self.auth_failed = [False] * n
        ivl = max(1, int(self.heartbeat_s * 1000))
        timeout = max(1, int(self.hb_timeout_s * 1000))
        for ep in self.endpoints:
            for socks, mons, ping_ms in ((self.socks, self.monitors, ivl),
                                         (self.hb_socks, self.hb_monitors, max(1, ivl // 2))):
                s = self.ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.HEARTBEAT_IVL, ping_ms)
                s.setsockopt(zmq.HEARTBEAT_TIMEOUT, timeout)
                s.setsockopt(zmq.HEARTBEAT_TTL, timeout)
                s.setsockopt(zmq.RECONNECT_IVL, 100)
                if curve is not None:
                    from zmq.auth import load_certificate

                    pub, sec = load_certificate(str(curve[0]))
                    server_pub, _ = load_certificate(str(curve[1]))
                    s.curve_publickey, s.curve_secretkey, s.curve_serverkey = pub, sec, server_pub
                mon = s.get_monitor_socket(_DOWN_EVENTS | _UP_EVENT | _AUTH_FAIL_EVENTS)
                s.connect(ep)
                socks.append(s)
                mons.append(mon)
        self.poller = zmq.Poller()
        for s in self.socks:
            self.poller.register(s, zmq.POLLIN)
        for m in self.monitors + self.hb_monitors:
            self.poller.register(m, zmq.POLLIN)

    # --- public API -------------------------------------------------------------------------
    def shard_of(self, ids: np.ndarray) -> np.ndarray:
        return P.shard_of(ids, self.num_shards)

    def register(self, tables: list[TableConfig]) -> None:
        """Declare tables on every shard (a no-op for tables already there with the same config)."""
        from cosparse.optim import state_width

        text = json.dumps([dataclasses.asdict(t) for t in tables])
        self._call_all(lambda: P.Message(P.OP_REGISTER, text=text))
        for t in tables:  # row widths, so that even a first large pull is split to fit
            self._widths[(t.name, False)] = t.dim
            self._widths[(t.name, True)] = t.dim + state_width(t.optimizer.kind, t.dim)

    def pull(self, table: str, ids: np.ndarray, with_state: bool = False, peek: bool = False
             ) -> PullResult:
        """Rows and versions of ``ids`` (any order, duplicates allowed), in that order.

        ``peek``: unknown IDs read their initial value and are not created (version -1)."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        order, bounds = self._split(ids)
        flags = (P.FLAG_WITH_STATE if with_state else 0) | (P.FLAG_PEEK if peek else 0)
        width = self._widths.get((table, with_state))
        spans = self._chunks(bounds, 8 + 4 * (width or 0))
        reqs = [(i, P.Message(P.OP_PULL, flags=flags, text=table, arrays=[ids[order[lo:hi]]]))
                for i, lo, hi in spans]
        replies = self._call(reqs)
        if not replies:
            return PullResult(np.zeros((0, 0), np.float32), np.zeros(0, np.int64), {})
        width = replies[0].arrays[0].shape[1]
        self._widths[(table, with_state)] = width
        rows = np.empty((ids.shape[0], width), dtype=np.float32)
        versions = np.empty(ids.shape[0], dtype=np.int64)
        counters: dict[int, int] = {}
        for (i, lo, hi), r in zip(spans, replies, strict=True):
            if r.arrays[0].shape != (hi - lo, width) or r.arrays[1].shape != (hi - lo,):
                raise PSError(i, self.endpoints[i], P.E_BAD_FRAME, "reply has the wrong shape")
            rows[order[lo:hi]] = r.arrays[0]
            versions[order[lo:hi]] = r.arrays[1]
            counters[i] = min(counters.get(i, int(r.arg)), int(r.arg))
        return PullResult(rows, versions, counters)

    def push(self, table: str, ids: np.ndarray, grads: np.ndarray, step: int) -> dict[int, int]:
        """Apply ``grads`` [n, dim] of unique ``ids`` at 1-based ``step`` on the owning shards;
        returns each involved shard's write counter after the write."""
        return self._write(P.OP_PUSH, table, ids, grads, step)

    def dump(self, table: str) -> tuple[np.ndarray, np.ndarray]:
        """Every row of ``table`` on every shard, with its optimizer state: (ids, rows)."""
        parts = [r.arrays for r in self._call_all(lambda: P.Message(P.OP_DUMP, text=table))]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def push_rows(self, table: str, ids: np.ndarray, rows: np.ndarray) -> dict[int, int]:
        """Overwrite rows with their optimizer state ([n, dim + state]) on the owning shards."""
        return self._write(P.OP_PUSH_ROWS, table, ids, rows, 0)

    def snapshot(self, name: str = "", incremental: bool = False) -> dict[int, str]:
        """Every shard snapshots into its data dir (or the sub-directory ``name``); returns the
        snapshot name per shard."""
        flags = P.FLAG_INCREMENTAL if incremental else 0
        replies = self._call_all(lambda: P.Message(P.OP_SNAPSHOT, flags=flags, text=name))
        return {i: r.text for i, r in enumerate(replies)}

    def stats(self) -> list[dict]:
        """Each shard's STATS: rows, bytes in/out, requests, queue depth, write counter, limits."""
        return [json.loads(r.text) for r in self._call_all(lambda: P.Message(P.OP_STATS))]

    def ping(self, timeout_s: float | None = None) -> list[float]:
        """Round-trip seconds of a PING to every shard (``PSUnavailable`` when one is dead)."""
        t0 = time.perf_counter()
        self._call_all(lambda: P.Message(P.OP_PING), timeout_s)
        return [time.perf_counter() - t0] * self.num_shards

    def close(self) -> None:
        for s in self.socks + self.hb_socks:
            s.disable_monitor()
        for m in self.monitors + self.hb_monitors:
            m.close(0)
        for s in self.socks + self.hb_socks:
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

    def _chunks(self, bounds: dict[int, tuple[int, int]], row_bytes: int
                ) -> list[tuple[int, int, int]]:
        """(shard, lo, hi) spans of at most ``CHUNK_ROWS`` rows and about ``CHUNK_BYTES`` bytes,
        and within each shard's own limits."""
        row_bytes = max(1, row_bytes)
        big = [i for i, (lo, hi) in bounds.items() if hi - lo > P.SMALL_REQUEST_ROWS
               or (hi - lo) * row_bytes > P.SMALL_REQUEST_BYTES]
        if any(self._limits[i] is None for i in big):
            self._fetch_limits()
        spans = []
        for i, (lo, hi) in bounds.items():
            max_bytes, max_rows = self._limits[i] or (CHUNK_BYTES + _OVERHEAD, CHUNK_ROWS)
            fit = min(CHUNK_BYTES, max_bytes - _OVERHEAD) // row_bytes
            step = max(1, min(CHUNK_ROWS, max_rows, fit))
            spans += [(i, a, min(a + step, hi)) for a in range(lo, hi, step)]
        return spans

    def _fetch_limits(self) -> None:
        for i, r in enumerate(self._call_all(lambda: P.Message(P.OP_PING))):
            doc = json.loads(r.text)
            self._limits[i] = (int(doc.get("max_message_bytes", CHUNK_BYTES + _OVERHEAD)),
                               int(doc.get("max_request_rows", CHUNK_ROWS)))

    def _write(self, op: int, table: str, ids: np.ndarray, values: np.ndarray, step: int
               ) -> dict[int, int]:
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        values = np.ascontiguousarray(values, dtype=np.float32)
        order, bounds = self._split(ids)
        width = values.shape[1] if values.ndim == 2 else 1
        reqs = [(i, P.Message(op, arg=int(step), text=table,
                              arrays=[ids[order[lo:hi]], values[order[lo:hi]]]))
                for i, lo, hi in self._chunks(bounds, 8 + 4 * width)]
        counters: dict[int, int] = {}
        for (i, _), r in zip(reqs, self._call(reqs), strict=True):
            counters[i] = max(counters.get(i, int(r.arg)), int(r.arg))
        return counters

    def _call_all(self, make: Callable[[], P.Message], timeout_s: float | None = None
                  ) -> list[P.Message]:
        return self._call([(i, make()) for i in range(self.num_shards)], timeout_s)

    def _count(self, op: int, nbytes: int) -> None:
        if op == P.OP_PULL:
            self.counters.bytes_pull += nbytes
        elif op in _PUSH_OPS:
            self.counters.bytes_push += nbytes
        else:
            self.counters.bytes_other += nbytes

    def _drain_monitor(self, i: int) -> None:
        for hb, mon in ((False, self.monitors[i]), (True, self.hb_monitors[i])):
            while True:
                try:
                    ev = recv_monitor_message(mon, zmq.NOBLOCK)
                except zmq.Again:
                    break
                e, now = ev["event"], time.monotonic()
                up, lost = (self.hb_up, self.hb_lost_at) if hb else (self.up, self.lost_at)
                if e & _UP_EVENT:
                    up[i] = True
                    self.auth_failed[i] = self.refused[i] = False
                    self.last_reply[i] = max(self.last_reply[i], now)
                elif e & _AUTH_FAIL_EVENTS:
                    self.auth_failed[i] = True
                elif e & zmq.EVENT_CLOSED and lost[i] and not up[i]:
                    self.refused[i] = True  # a reconnect attempt failed: nothing listens there
                elif e & _DOWN_EVENTS and up[i]:
                    up[i] = False
                    lost[i] = now
                    if not hb:
                        self.down_since[i] = now
                        self.sessions[i] = None  # a new connection needs a new session

    def _call(self, reqs: list[tuple[int, P.Message]], timeout_s: float | None = None
              ) -> list[P.Message]:
        """Send every (shard, request), then wait for all replies; returns them in that order."""
        # ZeroMQ sockets are not thread-safe: the planner's prefetch pulls and the trainer's
        # pushes share this client, so requests go out one call at a time
        with self._lock:
            return _Call(self, reqs, self.timeout_s if timeout_s is None else timeout_s).run()

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
                    raise PSUnavailable(i, self.endpoints[i], f"could not send for {wait_s:.1f} s "
                                                              "(not connected, or the send queue "
                                                              "is full)", self._silence(i)) from None
                self.monitors[i].poll(50)

    def _silence(self, i: int) -> float | None:
        """Seconds since shard ``i``'s last sign of life (None: it never answered).

        The last reply or connection; when a connection dropped and reconnects are refused, the
        drop (the process is gone); when it dropped and nothing refuses (a stopped process, a
        silent host), its heartbeat timeout before the drop, the last moment a PONG can have
        arrived (a fraction of ``heartbeat_s`` late at most)."""
        drops = [lost[i] for up, lost in ((self.up, self.lost_at), (self.hb_up, self.hb_lost_at))
                 if not up[i] and lost[i]]
        last = self.last_reply[i]
        if drops:
            last = max(last, min(drops) if self.refused[i] else min(drops) - self.hb_timeout_s)
        return time.monotonic() - last if last else None

    def _check_health(self, pending: dict[int, _Pending]) -> None:
        now = time.monotonic()
        grace = 3 * self.heartbeat_s
        # after a drop, a resumed or restarted shard reconnects within ms, and a dead one refuses
        # the first reconnect (RECONNECT_IVL plus jitter, 200 ms at most): wait that long to say which
        settle = min(0.3, self.heartbeat_s)
        for pend in pending.values():
            i, ep = pend.shard, self.endpoints[pend.shard]
            if self.auth_failed[i]:
                raise PSAuthError(i, ep, P.E_AUTH, "CURVE handshake refused")
            waited = now - pend.sent
            name = P.OP_NAMES.get(pend.op, str(pend.op))
            why = None
            if self.lost_at[i] >= pend.sent and (self.refused[i] or now - self.lost_at[i] >= settle):
                why = f"connection lost with a {name} in flight for {waited:.1f} s"
            elif (self.hb_lost_at[i] and not self.hb_up[i]
                  and now - max(self.hb_lost_at[i], pend.sent) >= settle):
                why = f"its heartbeat connection dropped {now - self.hb_lost_at[i]:.1f} s ago; a {name} " \
                      f"has waited {waited:.1f} s"
            elif not self.up[i] and now - self.down_since[i] > grace:
                why = f"not connected for {now - self.down_since[i]:.1f} s; a {name} has waited " \
                      f"{waited:.1f} s"
            if why is None:
                continue
            silence = self._silence(i)
            if self.refused[i]:
                cause = "its endpoint refuses connections (the process is gone)"
            else:
                cause = (f"heartbeats unanswered for {self.hb_timeout_s:g} s (heartbeat_s "
                         f"{self.heartbeat_s:g}): stopped, hung or unreachable")
            said = f"silent for {silence:.1f} s" if silence is not None else "never answered"
            raise PSUnavailable(i, ep, f"{said}: {why}; {cause}", silence)


class _Call:
    """One ``PSClient._call``: sends the requests (opening HMAC sessions first where needed),
    then collects one reply per request, checking the shards' health on every poll slice."""

    def __init__(self, c: PSClient, reqs: list[tuple[int, P.Message]], timeout: float) -> None:
        self.c, self.reqs, self.timeout = c, reqs, timeout
        self.out: list[P.Message | None] = [None] * len(reqs)
        self.pending: dict[int, _Pending] = {}  # request id -> what is in flight
        self.waiting: dict[int, list[int]] = {}  # shard -> requests waiting for its session
        self.retries = [0] * len(reqs)
        self.left = len(reqs)

    def run(self) -> list[P.Message]:
        c = self.c
        sent_at = time.time()
        moved0 = c.counters.bytes_pull + c.counters.bytes_push + c.counters.bytes_other
        for idx in range(len(self.reqs)):
            self._start(idx)
        t_start = time.monotonic()
        deadline = t_start + self.timeout
        try:
            while self.left:
                now = time.monotonic()
                if now >= deadline:
                    i = next(iter(self.pending.values())).shard
                    # (a silent shard would have lost its heartbeat connection by now)
                    answers = c.hb_up[i] and self.timeout > c.hb_timeout_s + c.heartbeat_s
                    busy = " (it answers heartbeats: busy or overloaded)" if answers else ""
                    raise PSUnavailable(i, c.endpoints[i], f"no reply within the request timeout "
                                                           f"of {self.timeout:g} s{busy}",
                                        c._silence(i))
                events = dict(c.poller.poll(max(1, int(min(deadline - now, 0.05) * 1000))))
                for i, s in enumerate(c.socks):
                    if c.monitors[i] in events or c.hb_monitors[i] in events:
                        c._drain_monitor(i)
                    if s in events:
                        self._receive(i, s)
                c._check_health(self.pending)
                if c.watch is not None:
                    c.watch()
            if c.link is not None:  # requests and replies cross the link: two messages
                k = c.counters
                c.link.transfer(k.bytes_pull + k.bytes_push + k.bytes_other - moved0, 2, sent_at)
        finally:
            c.counters.wait_s += time.monotonic() - t_start
        return self.out  # type: ignore[return-value]

    def _start(self, idx: int) -> None:
        c = self.c
        i, msg = self.reqs[idx]
        if c.key is not None and c.sessions[i] is None:
            if i not in self.waiting:  # open a session first
                self.waiting[i] = []
                nonce = os.urandom(P.NONCE_BYTES)
                hello = P.Message(P.OP_HELLO, arrays=[np.frombuffer(nonce, dtype=np.uint8)])
                self._send(i, hello, -1, b"", nonce)
            self.waiting[i].append(idx)
            return
        session = c.sessions[i] or b""
        self._send(i, msg, idx, session, session)

    def _send(self, i: int, msg: P.Message, idx: int, mac_session: bytes, reply_session: bytes
              ) -> None:
        c = self.c
        c._rid = (c._rid + 1) & 0xFFFFFFFFFFFFFFFF  # also the HMAC session's counter
        msg.request_id = c._rid
        frames = P.encode(msg, c.key, mac_session)
        c._send(i, frames, min(self.timeout, 3 * c.heartbeat_s))
        c._count(msg.op, P.frames_nbytes(frames))
        c.counters.requests += 1
        self.pending[msg.request_id] = _Pending(idx, i, msg.op, time.monotonic(), reply_session)

    def _receive(self, i: int, s: zmq.Socket) -> None:
        c, ep = self.c, self.c.endpoints[i]
        while True:
            try:
                frames = s.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            c.up[i] = True
            c.last_reply[i] = time.monotonic()
            try:
                msg = P.decode(frames, None)
            except P.ProtocolError as e:
                raise PSError(i, ep, e.code, f"malformed reply: {e}") from e
            c._count(msg.op, P.frames_nbytes(frames))
            pend = self.pending.get(msg.request_id)
            if pend is None or pend.shard != i:
                continue  # the late reply of a request that already failed
            if msg.error == P.E_AUTH:
                raise PSAuthError(i, ep, msg.error, msg.text)
            if msg.error == P.E_SESSION and pend.idx >= 0:  # nothing was done: open one, resend
                del self.pending[msg.request_id]
                self.retries[pend.idx] += 1
                if self.retries[pend.idx] > MAX_SESSION_RETRIES:
                    raise PSAuthError(i, ep, msg.error, f"the shard lost the HMAC session "
                                                        f"{self.retries[pend.idx]} times: {msg.text}")
                if c.sessions[i] == pend.session:
                    c.sessions[i] = None
                self._start(pend.idx)
                continue
            if c.key is not None:
                try:
                    msg = P.decode(frames, c.key, pend.session)  # the reply must carry a valid HMAC
                except P.ProtocolError as e:
                    raise PSAuthError(i, ep, P.E_AUTH, f"reply: {e}") from e
            del self.pending[msg.request_id]
            if pend.idx < 0:
                self._opened(i, msg)
                continue
            if msg.error != P.E_OK:
                raise PSError(i, ep, msg.error, msg.text)
            self.out[pend.idx] = msg
            self.left -= 1

    def _opened(self, i: int, msg: P.Message) -> None:
        """A HELLO reply: the session is open, send what waited for it."""
        c, ep = self.c, self.c.endpoints[i]
        if msg.error != P.E_OK:
            raise PSAuthError(i, ep, msg.error, f"HELLO refused: {msg.text}")
        a = msg.arrays
        if len(a) != 1 or a[0].dtype != np.uint8 or a[0].shape != (P.NONCE_BYTES,):
            raise PSAuthError(i, ep, P.E_AUTH, "HELLO reply without a session nonce")
        c.sessions[i] = a[0].tobytes()
        for idx in self.waiting.pop(i, []):
            self._start(idx)
