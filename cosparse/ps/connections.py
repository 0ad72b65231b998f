"""The client's connections to its shards and what they say about each shard's health.

Per shard: a data DEALER socket and a second, idle heartbeat DEALER (ZMTP PING/PONG; a large
request that a stopped shard never reads would queue the data connection's PINGs behind it),
each with a socket monitor. The monitors tell when a connection comes up, drops, is refused or
fails its CURVE handshake; from that, ``check_health`` turns a request in flight on a lost or
silent shard into ``PSUnavailable`` (naming how long the shard has been silent) instead of a
wait for the full request timeout. Also held here, because a new connection needs them anew: the
HMAC session per shard and the request counter (the sessions' replay counter).
"""

from __future__ import annotations

import errno
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import zmq
from zmq.utils.monitor import recv_monitor_message

from cosparse.ps import protocol as P
from cosparse.ps.errors import PSAuthError, PSUnavailable
from cosparse.ps.keys import client_curve_keys

_DOWN_EVENTS = zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
_UP_EVENT = zmq.EVENT_HANDSHAKE_SUCCEEDED
# (a handshake that times out, e.g. to a stopped shard, is HANDSHAKE_FAILED_NO_DETAIL: not auth)
_AUTH_FAIL_EVENTS = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
_HANDSHAKE_CUT = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
# A shard that refuses the mechanism closes the connection as soon as it reads the client's
# greeting. When it reads that greeting in one piece (a loaded machine), it closes before it has
# sent the rest of its own, and the client sees the connection cut mid-handshake (EPIPE or
# ECONNRESET: no detail) instead of the mismatch; it then reconnects. A shard that dies cuts one
# handshake and then refuses connections, so this many cuts in a row on one socket, with no
# handshake succeeding between them, are a refusal too.
_CUTS_REFUSED = 2
_CUT_ERRNOS = (errno.EPIPE, errno.ECONNRESET)


@dataclass
class Pending:
    """A request in flight: its index in the call (-1 for HELLO), shard, op, send time and the
    nonce its reply is MACed under."""

    idx: int
    shard: int
    op: int
    sent: float
    session: bytes = b""


class ShardConnections:
    """The data and heartbeat connections of every shard, their state and the poller over them.

    ``heartbeat_s``: the data connection pings every ``heartbeat_s``, the heartbeat connection
    twice as often; a PING unanswered for ``hb_timeout_s`` (3 heartbeats) drops the connection.
    ``curve``: (client secret key file, server public key file).
    """

    def __init__(self, endpoints: list[str], heartbeat_s: float,
                 curve: tuple[str | Path, str | Path] | None = None) -> None:
        self.endpoints = endpoints
        n = len(endpoints)
        self.heartbeat_s = heartbeat_s
        # a connection whose PING is unanswered for hb_timeout_s is dropped; the heartbeat
        # connection pings twice per heartbeat_s, so a stopped shard is dropped within
        # heartbeat_s / 2 + hb_timeout_s of its last sign of life
        self.hb_timeout_s = 3 * heartbeat_s
        self.rid = 0  # the last request id sent (also the HMAC sessions' counter)
        self.sessions: list[bytes | None] = [None] * n  # HMAC session nonce per shard
        now = time.monotonic()
        self.up = [False] * n
        self.down_since = [now] * n
        self.lost_at = [0.0] * n  # last time a data connection of shard i dropped
        self.hb_up = [False] * n
        self.hb_lost_at = [0.0] * n  # last time the heartbeat connection of shard i dropped
        self.last_reply = [0.0] * n  # last time anything arrived from shard i
        self.refused = [False] * n  # since its last drop, shard i's endpoint refused a reconnect
        self.auth_failed = [False] * n
        self.cuts = [[0, 0] for _ in range(n)]  # handshakes cut by shard i, per (data, hb) socket
        self.ctx = zmq.Context()
        self.socks: list[zmq.Socket] = []
        self.monitors: list[zmq.Socket] = []
        self.hb_socks: list[zmq.Socket] = []
        self.hb_monitors: list[zmq.Socket] = []
        # closed in order (monitors, then sockets, then the context) by close(), or when this
        # object is garbage-collected unclosed: a context collected on its own with sockets
        # still open would block its term() forever, in whatever code the collector ran in
        self._finalizer = weakref.finalize(self, _shut, self.ctx, self.socks, self.hb_socks,
                                           self.monitors, self.hb_monitors)
        self._connect(curve)
        self.poller = zmq.Poller()
        for s in self.socks:
            self.poller.register(s, zmq.POLLIN)
        for m in self.monitors + self.hb_monitors:
            self.poller.register(m, zmq.POLLIN)

    def _connect(self, curve: tuple[str | Path, str | Path] | None) -> None:
        ivl = max(1, int(self.heartbeat_s * 1000))
        timeout = max(1, int(self.hb_timeout_s * 1000))
        keys = client_curve_keys(curve) if curve is not None else None
        for ep in self.endpoints:
            for socks, mons, ping_ms in ((self.socks, self.monitors, ivl),
                                         (self.hb_socks, self.hb_monitors, max(1, ivl // 2))):
                s = self.ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.HEARTBEAT_IVL, ping_ms)
                s.setsockopt(zmq.HEARTBEAT_TIMEOUT, timeout)
                s.setsockopt(zmq.HEARTBEAT_TTL, timeout)
                s.setsockopt(zmq.RECONNECT_IVL, 100)
                if keys is not None:
                    s.curve_publickey, s.curve_secretkey, s.curve_serverkey = keys
                mon = s.get_monitor_socket(_DOWN_EVENTS | _UP_EVENT | _AUTH_FAIL_EVENTS
                                           | _HANDSHAKE_CUT)
                s.connect(ep)
                socks.append(s)
                mons.append(mon)

    def next_request_id(self) -> int:
        self.rid = (self.rid + 1) & 0xFFFFFFFFFFFFFFFF
        return self.rid

    def close(self) -> None:
        self._finalizer()

    def drain(self, i: int) -> None:
        """Take in what shard ``i``'s monitors reported (connections up, dropped, refused)."""
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
                    self.cuts[i][hb] = 0
                    self.last_reply[i] = max(self.last_reply[i], now)
                elif e & _AUTH_FAIL_EVENTS:
                    self.auth_failed[i] = True
                elif e & _HANDSHAKE_CUT:
                    if ev["value"] in _CUT_ERRNOS:
                        self.cuts[i][hb] += 1
                        self.auth_failed[i] |= self.cuts[i][hb] >= _CUTS_REFUSED
                elif e & zmq.EVENT_CLOSED and lost[i] and not up[i]:
                    self.refused[i] = True  # a reconnect attempt failed: nothing listens there
                elif e & _DOWN_EVENTS and up[i]:
                    up[i] = False
                    lost[i] = now
                    if not hb:
                        self.down_since[i] = now
                        self.sessions[i] = None  # a new connection needs a new session

    def received(self, i: int) -> None:
        """Something arrived from shard ``i``: it is connected and alive."""
        self.up[i] = True
        self.last_reply[i] = time.monotonic()

    def send(self, i: int, frames: list, wait_s: float) -> None:
        """Send to shard ``i``; with no connection yet, wait up to ``wait_s`` for one (a refused
        CURVE handshake is reported as such, not as an unreachable shard)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.socks[i].send_multipart(frames, zmq.NOBLOCK, copy=False)
                return
            except zmq.Again:
                self.drain(i)
                if self.auth_failed[i]:
                    raise PSAuthError(i, self.endpoints[i], P.E_AUTH, "CURVE handshake refused") from None
                if time.monotonic() > deadline:
                    raise PSUnavailable(i, self.endpoints[i], f"could not send for {wait_s:.1f} s "
                                                              "(not connected, or the send queue "
                                                              "is full)", self.silence(i)) from None
                self.monitors[i].poll(50)

    def silence(self, i: int) -> float | None:
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

    def check_health(self, pending: Iterable[Pending]) -> None:
        """Raise ``PSUnavailable`` (or ``PSAuthError``) for the first request in flight whose shard
        is lost: its connection dropped, its heartbeats stopped, or it never connected."""
        now = time.monotonic()
        grace = 3 * self.heartbeat_s
        # after a drop, a resumed or restarted shard reconnects within ms, and a dead one refuses
        # the first reconnect (RECONNECT_IVL plus jitter, 200 ms at most): wait that long to say which
        settle = min(0.3, self.heartbeat_s)
        for pend in pending:
            i, ep = pend.shard, self.endpoints[pend.shard]
            if self.auth_failed[i]:
                raise PSAuthError(i, ep, P.E_AUTH, "CURVE handshake refused")
            why = self._lost(pend, now, grace, settle)
            if why is None:
                continue
            silence = self.silence(i)
            if self.refused[i]:
                cause = "its endpoint refuses connections (the process is gone)"
            else:
                cause = (f"heartbeats unanswered for {self.hb_timeout_s:g} s (heartbeat_s "
                         f"{self.heartbeat_s:g}): stopped, hung or unreachable")
            said = f"silent for {silence:.1f} s" if silence is not None else "never answered"
            raise PSUnavailable(i, ep, f"{said}: {why}; {cause}", silence)

    def _lost(self, pend: Pending, now: float, grace: float, settle: float) -> str | None:
        """Why the shard of a request in flight counts as lost, or None while it does not."""
        i = pend.shard
        waited = now - pend.sent
        name = P.OP_NAMES.get(pend.op, str(pend.op))
        if self.lost_at[i] >= pend.sent and (self.refused[i] or now - self.lost_at[i] >= settle):
            return f"connection lost with a {name} in flight for {waited:.1f} s"
        if (self.hb_lost_at[i] and not self.hb_up[i]
                and now - max(self.hb_lost_at[i], pend.sent) >= settle):
            return f"its heartbeat connection dropped {now - self.hb_lost_at[i]:.1f} s ago; a {name} " \
                   f"has waited {waited:.1f} s"
        if not self.up[i] and now - self.down_since[i] > grace:
            return f"not connected for {now - self.down_since[i]:.1f} s; a {name} has waited " \
                   f"{waited:.1f} s"
        return None


def _shut(ctx: zmq.Context, socks: list, hb_socks: list, monitors: list, hb_monitors: list
          ) -> None:
    """Disable the monitors, close every socket at once (linger 0), then the context."""
    for s in socks + hb_socks:
        if not s.closed:
            s.disable_monitor()
    for m in monitors + hb_monitors:
        m.close(0)
    for s in socks + hb_socks:
        s.close(0)
    ctx.term()
