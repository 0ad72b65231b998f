"""The shard's libzmq ROUTER transport, kept for CURVE (``ps serve --curve-secret``).

Incomplete messages: libzmq cannot bound a multipart message's bytes (``MAXMSGSIZE`` is per
frame), but CURVE's handshake authenticates a client (its public key must be in
``<keydir>/clients``) before libzmq accepts any message frame from it, so nothing is held for a
peer *before authentication*; an authenticated client is trusted not to send a huge incomplete
message. (The NULL-mechanism modes, plain and ``--auth-key``, authenticate per message, after it
has arrived, so they use ``transport.ZmtpTransport``, which bounds those bytes.)

Queued replies: each reply is sent without a copy and tracked (pyzmq ``MessageTracker``) per
connection until libzmq has sent it; while a connection's unsent reply bytes are at or over
``--max-queued-reply-bytes``, its further replies are dropped and counted (``replies_dropped``).
libzmq frees a disconnected peer's queue at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from pathlib import Path

import zmq

from cosparse.ps.transport import CHECK_S, TransportLimits


class CurveTransport:
    """A CURVE ROUTER socket and the serving loop over it."""

    def __init__(self, host: str, port: int, limits: TransportLimits, secret_file: str) -> None:
        self.limits = limits
        self.ctx = zmq.Context()
        self.auth = None
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, limits.max_message_bytes)  # per frame: drops the peer
        self._setup_curve(secret_file)
        self.sock.bind(f"tcp://{host}:{'*' if port == 0 else port}")
        self.endpoint = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        # per connection (routing identity): (trackers, bytes) of each reply libzmq still holds
        self.unsent: dict[bytes, deque[tuple[list, int]]] = {}
        self.queued = 0  # reply bytes libzmq still holds, all connections
        self.replies_dropped = 0

    def _setup_curve(self, secret_file: str) -> None:
        from zmq.auth import load_certificate
        from zmq.auth.thread import ThreadAuthenticator

        if not zmq.has("curve"):
            raise RuntimeError("this libzmq has no CURVE support; use --auth-key")
        public, secret = load_certificate(secret_file)
        if secret is None:
            raise ValueError(f"{secret_file}: not a CURVE secret key file")
        self.auth = ThreadAuthenticator(self.ctx)
        self.auth.start()
        clients = Path(secret_file).parent / "clients"
        # only client public keys in <keydir>/clients may connect
        self.auth.configure_curve(domain="*", location=str(clients))
        self.sock.curve_secretkey = secret
        self.sock.curve_publickey = public
        self.sock.curve_server = True

    def serve(self, handle: Callable[[list], None], keep_going: Callable[[], bool],
              note_depth: Callable[[int], None], stats: dict) -> None:
        """Receive and answer (``handle(frames)``, ``frames[0]`` the identity as bytes) until
        ``keep_going()`` is false (asked per message and every ``CHECK_S`` when idle);
        ``stats["transport"]`` is kept current. (libzmq's I/O thread answers PINGs.)"""
        # a blocking receive (no poll per message); the timeout is the idle check's period
        self.sock.setsockopt(zmq.RCVTIMEO, int(CHECK_S * 1000))
        while True:
            try:
                first = self.sock.recv_multipart(copy=False)
            except zmq.Again:
                self._prune_all()
                stats["transport"] = self.snapshot()
                if not keep_going():
                    return
                continue
            batch = [first]  # and the messages already waiting behind it: the queue depth
            while len(batch) < 1024 and self.sock.get(zmq.EVENTS) & zmq.POLLIN:
                batch.append(self.sock.recv_multipart(zmq.NOBLOCK, copy=False))
            note_depth(len(batch))
            stats["transport"] = self.snapshot()
            for frames in batch:
                handle([frames[0].bytes, *frames[1:]])
                if not keep_going():
                    return

    def send(self, ident: bytes, frames: list) -> None:
        """Send a reply unless this connection's unsent replies are over the cap (then count
        it as dropped)."""
        queue = self.unsent.get(ident)
        if queue is not None and self._prune(ident, queue) >= self.limits.max_queued_reply_bytes:
            self.replies_dropped += 1
            return
        parts = [ident, *frames]
        trackers, nbytes = [], 0
        for i, f in enumerate(parts):
            t = self.sock.send(f, zmq.SNDMORE if i < len(parts) - 1 else 0, copy=False, track=True)
            if t is not None and not t.done:
                trackers.append(t)
                nbytes += memoryview(f).nbytes
        if trackers:
            self.unsent.setdefault(ident, deque()).append((trackers, nbytes))
            self.queued += nbytes

    def snapshot(self) -> dict:
        """The transport's counters (a copy, for STATS)."""
        return {"queued_reply_bytes": self.queued, "replies_dropped": self.replies_dropped}

    def _prune(self, ident: bytes, queue: deque) -> int:
        """Forget this connection's replies that have left; its unsent bytes."""
        while queue and all(t.done for t in queue[0][0]):
            self.queued -= queue.popleft()[1]
        if not queue:
            del self.unsent[ident]
            return 0
        return sum(n for _, n in queue)

    def _prune_all(self) -> None:
        for ident, queue in list(self.unsent.items()):
            self._prune(ident, queue)

    def close(self) -> None:
        self.sock.close(0)
        if self.auth is not None:
            self.auth.stop()
        self.ctx.term()
