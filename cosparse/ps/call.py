"""One round of requests of a ``PSClient``: send them all, then collect one reply per request.

``Call`` opens an HMAC session first where a shard has none (HELLO), sends a request again after
an ``E_SESSION`` reply (at most ``MAX_SESSION_RETRIES`` times), checks every reply's MAC, and on
every poll slice checks the shards' health (``ShardConnections.check_health``), the optional
``watch`` and a stop request (``cosparse.stopping``: SIGTERM gives up the call).
``ClientCounters`` counts every byte on the sockets, headers included.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import zmq

from cosparse import stopping, waits
from cosparse.link import LinkShaper
from cosparse.ps import protocol as P
from cosparse.ps.connections import Pending, ShardConnections
from cosparse.ps.errors import PSAuthError, PSError, PSUnavailable, error_reply
from cosparse.spans import SPANS

MAX_SESSION_RETRIES = 3
_PUSH_OPS = (P.OP_PUSH, P.OP_PUSH_ROWS)


@dataclass
class ClientCounters:
    """Bytes on the sockets by kind (PULL; PUSH and PUSH_ROWS; others), requests, time waited."""

    bytes_pull: int = 0
    bytes_push: int = 0
    bytes_other: int = 0
    requests: int = 0
    wait_s: float = 0.0

    def count(self, op: int, nbytes: int) -> None:
        if op == P.OP_PULL:
            self.bytes_pull += nbytes
        elif op in _PUSH_OPS:
            self.bytes_push += nbytes
        else:
            self.bytes_other += nbytes

    @property
    def moved(self) -> int:
        return self.bytes_pull + self.bytes_push + self.bytes_other


class Call:
    """Sends ``reqs`` (shard, request) over ``conns``, then waits up to ``timeout`` seconds for
    every reply; ``run`` returns them in the order of ``reqs``.

    ``send(shard, frames, wait_s)``: what puts a message on the wire (default
    ``conns.send``; the client passes its own ``_send``, which tests wiretap). ``namespace``:
    the client's, named in its HELLO (a shard with ``--namespaces`` checks it with that
    namespace's key)."""

    def __init__(self, conns: ShardConnections, key: bytes | None, counters: ClientCounters,
                 reqs: list[tuple[int, P.Message]], timeout: float,
                 watch: Callable[[], None] | None = None, link: LinkShaper | None = None,
                 send: Callable[[int, list, float], None] | None = None,
                 namespace: str = "") -> None:
        self.conns, self.key, self.counters = conns, key, counters
        self.namespace = namespace
        self.reqs, self.timeout, self.watch, self.link = reqs, timeout, watch, link
        self.send = send if send is not None else conns.send
        self.out: list[P.Message | None] = [None] * len(reqs)
        self.pending: dict[int, Pending] = {}  # request id -> what is in flight
        self.waiting: dict[int, list[int]] = {}  # shard -> requests waiting for its session
        self.retries = [0] * len(reqs)
        self.left = len(reqs)

    def run(self) -> list[P.Message]:
        c = self.conns
        sent_at = time.time()
        moved0 = self.counters.moved
        for idx in range(len(self.reqs)):
            self._start(idx)
        t_start = time.monotonic()
        deadline = t_start + self.timeout
        try:
            while self.left:
                now = time.monotonic()
                if now >= deadline:
                    raise self._timed_out()
                events = dict(c.poller.poll(max(1, int(min(deadline - now, 0.05) * 1000))))
                for i, s in enumerate(c.socks):
                    if c.monitors[i] in events or c.hb_monitors[i] in events:
                        c.drain(i)
                    if s in events:
                        self._receive(i, s)
                c.check_health(self.pending.values())
                stopping.check("a PS request in flight")  # (SIGTERM: never waited out)
                if self.watch is not None:
                    self.watch()
            if self.link is not None:  # requests and replies cross the link: two messages
                self.link.transfer(self.counters.moved - moved0, 2, sent_at)
        finally:
            self.counters.wait_s += time.monotonic() - t_start
            waits.record("ps_request", time.monotonic() - t_start)
        return self.out  # type: ignore[return-value]

    def _timed_out(self) -> PSUnavailable:
        c = self.conns
        i = next(iter(self.pending.values())).shard
        # (a silent shard would have lost its heartbeat connection by now)
        answers = c.hb_up[i] and self.timeout > c.hb_timeout_s + c.heartbeat_s
        busy = " (it answers heartbeats: busy or overloaded)" if answers else ""
        return PSUnavailable(i, c.endpoints[i], f"no reply within the request timeout "
                                                f"of {self.timeout:g} s{busy}", c.silence(i))

    def _start(self, idx: int) -> None:
        c = self.conns
        i, msg = self.reqs[idx]
        if self.key is not None and c.sessions[i] is None:
            if i not in self.waiting:  # open a session first
                self.waiting[i] = []
                nonce = os.urandom(P.NONCE_BYTES)
                hello = P.Message(P.OP_HELLO, text=self.namespace,
                                  arrays=[np.frombuffer(nonce, dtype=np.uint8)])
                self._send(i, hello, -1, b"", nonce)
            self.waiting[i].append(idx)
            return
        session = c.sessions[i] or b""
        self._send(i, msg, idx, session, session)

    def _send(self, i: int, msg: P.Message, idx: int, mac_session: bytes, reply_session: bytes
              ) -> None:
        c = self.conns
        msg.request_id = c.next_request_id()  # also the HMAC session's counter
        frames = P.encode(msg, self.key, mac_session)
        self.send(i, frames, min(self.timeout, 3 * c.heartbeat_s))
        self.counters.count(msg.op, P.frames_nbytes(frames))
        self.counters.requests += 1
        self.pending[msg.request_id] = Pending(idx, i, msg.op, time.monotonic(), reply_session)

    def _receive(self, i: int, s: zmq.Socket) -> None:
        c, ep = self.conns, self.conns.endpoints[i]
        while True:
            try:
                frames = s.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            c.received(i)
            try:
                msg = P.decode(frames, None)
            except P.ProtocolError as e:
                raise PSError(i, ep, e.code, f"malformed reply: {e}") from e
            self.counters.count(msg.op, P.frames_nbytes(frames))
            pend = self.pending.get(msg.request_id)
            if pend is None or pend.shard != i:
                continue  # the late reply of a request that already failed
            if msg.error == P.E_AUTH:
                raise PSAuthError(i, ep, msg.error, msg.text)
            if msg.error == P.E_SESSION and pend.idx >= 0:  # nothing was done: open one, resend
                self._resend(i, msg, pend)
                continue
            if self.key is not None:
                try:
                    msg = P.decode(frames, self.key, pend.session)  # the reply must carry a valid HMAC
                except P.ProtocolError as e:
                    raise PSAuthError(i, ep, P.E_AUTH, f"reply: {e}") from e
            del self.pending[msg.request_id]
            SPANS.request(P.OP_NAMES.get(pend.op, str(pend.op)), i, pend.sent, time.monotonic())
            if pend.idx < 0:
                self._opened(i, msg)
                continue
            if msg.error != P.E_OK:
                raise error_reply(i, ep, msg.error, msg.text)
            self.out[pend.idx] = msg
            self.left -= 1

    def _resend(self, i: int, msg: P.Message, pend: Pending) -> None:
        """The shard lost the request's HMAC session (``E_SESSION``): open a new one, send again."""
        del self.pending[msg.request_id]
        self.retries[pend.idx] += 1
        if self.retries[pend.idx] > MAX_SESSION_RETRIES:
            raise PSAuthError(i, self.conns.endpoints[i], msg.error,
                              f"the shard lost the HMAC session {self.retries[pend.idx]} times: "
                              f"{msg.text}")
        if self.conns.sessions[i] == pend.session:
            self.conns.sessions[i] = None
        self._start(pend.idx)

    def _opened(self, i: int, msg: P.Message) -> None:
        """A HELLO reply: the session is open, send what waited for it."""
        c, ep = self.conns, self.conns.endpoints[i]
        if msg.error != P.E_OK:
            raise PSAuthError(i, ep, msg.error, f"HELLO refused: {msg.text}")
        a = msg.arrays
        if len(a) != 1 or a[0].dtype != np.uint8 or a[0].shape != (P.NONCE_BYTES,):
            raise PSAuthError(i, ep, P.E_AUTH, "HELLO reply without a session nonce")
        c.sessions[i] = a[0].tobytes()
        for idx in self.waiting.pop(i, []):
            self._start(idx)
