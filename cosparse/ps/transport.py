"""The shard's own ROUTER-side server transport (ZMTP 3.1, NULL mechanism) with memory bounds.

Why not libzmq's ROUTER: libzmq cannot bound a multipart message's bytes (``MAXMSGSIZE`` is per
frame, and an incomplete message's frames sit in its pipe, unseen, until the last one arrives),
and replies sent with ``copy=False`` queue inside it with no byte bound (only its 1000-message
high-water mark). Here every frame header is seen before its frame is read, and every queued
reply byte is counted. Unchanged libzmq DEALER clients talk to it (``zmtp``, ``zmtp_connection``).

Bounds (``TransportLimits``, set by ``ps serve``):

* request bytes held for one connection (its incomplete message plus its complete, unanswered
  ones) never exceed ``--max-message-bytes``. A message that would pass it is no longer held: the
  rest of it is read and thrown away, and its header answers it with an ``E_LIMIT`` error; once it
  passes twice the limit (an endless message), or when a single frame header announces more than
  the limit, the connection is dropped (nothing of that frame is read). A connection with
  complete messages waiting is paused instead (pipelined requests wait for their answers);
* request bytes held across connections never exceed ``--max-pending-bytes``; a connection whose
  frame would pass it is dropped (or paused, if it has answers coming that free bytes);
* at most ``MAX_FRAMES`` frames per message; a peer must finish its handshake within
  ``HANDSHAKE_S``; at most ``MAX_CONNECTIONS`` connections;
* reply bytes queued for a connection: once over ``--max-queued-reply-bytes``, its next requests
  wait (its socket is not read, so its TCP window and then its client block): at most that cap
  plus one reply is queued. A connection over the cap whose queue makes no progress for
  ``--stall-timeout-s`` is dropped, and so is one whose incomplete message gets no byte for as
  long. A closed or dropped connection's queue and buffers are freed at once.

Every drop is counted in STATS (``transport.dropped_connections`` by reason) and logged.
"""

from __future__ import annotations

import contextlib
import queue
import selectors
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from cosparse.ps import zmtp
from cosparse.ps.zmtp_connection import ADMIT, PAUSE, REFUSE, Connection, Dropped

HANDSHAKE_S = 10.0  # greeting and READY must arrive within this
MAX_CONNECTIONS = 4096
CHECK_S = 0.2  # period of the timeout sweep and of keep_going() when idle
_LOGGED_DROPS = 20  # drops logged per reason (then every 1000th)
_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE
_WAKER = object()  # selector data of the wake-up socket
_DONE = object()  # outbox: the message in flight is answered


def split_bind(bind: str) -> tuple[str, int]:
    """``ADDR:PORT`` of ``--bind`` as (host, port)."""
    host, sep, port = bind.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"--bind {bind!r}: expected ADDR:PORT (port 0 picks a free one)")
    return host, int(port)


@dataclass
class TransportLimits:
    max_message_bytes: int
    max_pending_bytes: int
    max_queued_reply_bytes: int
    stall_timeout_s: float

    @classmethod
    def derive(cls, max_message_bytes: int, max_pending_bytes: int | None,
               max_queued_reply_bytes: int | None, stall_timeout_s: float) -> TransportLimits:
        """The bounds, defaults derived from ``--max-message-bytes``: 4x that held in total,
        1x queued per connection."""
        m = max_message_bytes
        pending = 4 * m if max_pending_bytes is None else max_pending_bytes
        queued = m if max_queued_reply_bytes is None else max_queued_reply_bytes
        if pending < m:
            raise ValueError(f"--max-pending-bytes {pending}: at least --max-message-bytes ({m})")
        if queued < 1:
            raise ValueError(f"--max-queued-reply-bytes {queued}: at least 1")
        if not stall_timeout_s > 0:
            raise ValueError(f"--stall-timeout-s {stall_timeout_s}: must be positive")
        return cls(m, pending, queued, stall_timeout_s)


class ZmtpTransport:
    """A listening socket, its connections and the serving loop over them (one thread)."""

    def __init__(self, host: str, port: int, limits: TransportLimits) -> None:
        self.limits = limits
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.create_server((host, port), family=family, backlog=256)
        self.listener.setblocking(False)
        bound = self.listener.getsockname()[:2]
        self.endpoint = f"tcp://{'[' + bound[0] + ']' if family == socket.AF_INET6 else bound[0]}" \
                        f":{bound[1]}"
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, _READ, None)
        # the serving thread wakes the I/O thread through this pair (replies to send)
        self.waker, self.wakee = socket.socketpair()
        self.waker.setblocking(False)
        self.wakee.setblocking(False)
        self.sel.register(self.wakee, _READ, _WAKER)
        self.conns: dict[bytes, Connection] = {}
        self.next_id = 0
        self.held = 0  # request bytes held, all connections
        self.queued = 0  # reply bytes queued, all connections
        self.backpressured = 0  # times a connection's reply queue went over the cap
        self.replies_to_closed = 0
        self.refused = 0  # messages over --max-message-bytes (thrown away, answered)
        self.drops: dict[str, int] = {}  # dropped connections by reason
        # serving thread <-> I/O thread: one message in flight at a time (the cap is checked
        # per message), its reply frames and then _DONE back
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.outbox: deque = deque()
        self.in_flight = False
        self.drain: deque[Connection] = deque()  # connections with messages, taken in turn
        self.stopping = False

    # --- the serving thread ------------------------------------------------------------------
    def serve(self, handle: Callable[[list], None], keep_going: Callable[[], bool],
              note_depth: Callable[[int], None], stats: dict) -> None:
        """Answer messages on this thread (``handle(frames)`` per message, ``frames[0]`` the
        connection's identity; its reply through ``send``) while the I/O thread reads, answers
        PINGs and sends, so that a long request does not stop heartbeats; until ``keep_going()``
        is false (asked per message, and every ``CHECK_S`` when idle). ``stats["transport"]``
        is kept current."""
        io = threading.Thread(target=self._io_loop, name="ps-transport-io", daemon=True)
        io.start()
        try:
            while True:
                try:
                    frames, depth = self.inbox.get(timeout=CHECK_S)
                except queue.Empty:
                    stats["transport"] = self.snapshot()
                    if not keep_going() or not io.is_alive():
                        return
                    continue
                if depth:
                    note_depth(depth)
                stats["transport"] = self.snapshot()
                try:
                    handle(frames)
                finally:
                    self.outbox.append(_DONE)
                    self._wake()
                if not keep_going():
                    return
        finally:
            self.stopping = True
            self._wake()
            io.join(timeout=5.0)

    def send(self, ident: bytes, frames: list) -> None:
        """Queue a reply (frames: bytes-like, numpy arrays; held, not copied) for the I/O
        thread to send (called by ``handle``)."""
        bufs, last = [], len(frames) - 1
        for i, f in enumerate(frames):
            mv = memoryview(f)
            if mv.ndim != 1 or mv.format != "B":  # (cast() refuses an empty 2-D array)
                mv = mv.cast("B") if mv.nbytes else memoryview(b"")
            head = zmtp.frame_header(mv.nbytes, more=i < last)
            if mv.nbytes <= 1024:  # a small frame goes out with its header in one piece
                bufs.append(memoryview(head + bytes(mv)))
            else:
                bufs += [memoryview(head), mv]
        self.outbox.append((ident, bufs))

    def snapshot(self) -> dict:
        """The transport's counters (a copy, for STATS)."""
        return {"connections": len(self.conns), "pending_request_bytes": self.held,
                "queued_reply_bytes": self.queued, "backpressured": self.backpressured,
                "replies_to_closed": self.replies_to_closed, "refused_messages": self.refused,
                "dropped_connections": dict(self.drops)}

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):  # full of wake-ups already
            self.waker.send(b"w")

    # --- the I/O thread ---------------------------------------------------------------------
    def _io_loop(self) -> None:
        next_check = 0.0
        while not self.stopping:
            now = time.monotonic()
            if now >= next_check:
                self._sweep(now)
                next_check = now + CHECK_S
            pick = not self.in_flight and (self.drain or self._answerable())
            timeout = 0.0 if pick else max(0.0, next_check - now)
            for key, mask in self.sel.select(timeout):
                conn = key.data
                if conn is None:
                    self._accept()
                elif conn is _WAKER:
                    self._drain_wakes()
                else:
                    if mask & _WRITE:
                        self._flush(conn)
                    if mask & _READ and not conn.closed:
                        self._read(conn)
            self._take_replies()
            if not self.in_flight:
                self._hand_one()

    def _take_replies(self) -> None:
        while self.outbox:
            item = self.outbox.popleft()
            if item is _DONE:
                self.in_flight = False
                continue
            ident, bufs = item
            conn = self.conns.get(ident)
            if conn is None or conn.closed:
                self.replies_to_closed += 1
                continue
            self.queued += conn.queue(bufs)
            self._flush(conn)

    def _answerable(self) -> bool:
        cap = self.limits.max_queued_reply_bytes
        return any(c.messages and c.queued < cap for c in self.conns.values())

    def _hand_one(self) -> None:
        """Give the serving thread the next message: connections in turn, each while its reply
        queue is under the cap (checked per message)."""
        cap = self.limits.max_queued_reply_bytes
        depth = 0
        if not self.drain:
            self.drain = deque(c for c in self.conns.values() if c.messages and c.queued < cap)
            depth = sum(len(c.messages) for c in self.drain)
        while self.drain:
            conn = self.drain.popleft()
            if conn.closed or not conn.messages or conn.queued >= cap:
                continue
            frames, nbytes = conn.take_message()
            self.held -= nbytes
            if conn.messages:
                self.drain.append(conn)
            if conn.paused:  # the bytes it waited for may be free now
                conn.paused = False
                self._parse(conn)
            self.in_flight = True
            self.inbox.put((frames, depth))
            return

    def _drain_wakes(self) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while self.wakee.recv(4096):
                pass

    def close(self) -> None:
        for conn in list(self.conns.values()):
            conn.release()
        self.conns.clear()
        self.sel.close()
        self.listener.close()
        self.waker.close()
        self.wakee.close()

    # --- connections ------------------------------------------------------------------------
    def _accept(self) -> None:
        for _ in range(64):
            try:
                sock, _addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # e.g. out of file descriptors: refuse, keep serving
                self._count_drop("accept_failed", f"accept failed: {e}")
                return
            if len(self.conns) >= MAX_CONNECTIONS:
                sock.close()
                self._count_drop("too_many_connections", f"over {MAX_CONNECTIONS} connections")
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.next_id += 1
            conn = Connection(sock, b"\0" + self.next_id.to_bytes(8, "big"), time.monotonic(),
                              self.limits.max_message_bytes)
            self.conns[conn.ident] = conn
            self.queued += conn.queue([memoryview(zmtp.greeting() + zmtp.ready())])
            self._flush(conn)

    def _read(self, conn: Connection) -> None:
        self._take_in(conn, lambda: conn.read(self._admit, time.monotonic()))

    def _parse(self, conn: Connection) -> None:
        self._take_in(conn, lambda: conn.parse(self._admit) or True)

    def _take_in(self, conn: Connection, step: Callable[[], bool]) -> None:
        """Run ``step`` (read or parse; False: the peer closed), dropping the connection on a
        bound or protocol violation; then its PONGs out and its selector interest updated."""
        q0 = conn.queued
        try:
            alive = step()
        except Dropped as e:
            self._drop(conn, e.reason, str(e))
            return
        except zmtp.ZmtpError as e:
            self._drop(conn, "protocol", str(e))
            return
        except OSError:
            alive = False
        if not alive:
            self._close(conn)
            return
        self.queued += conn.queued - q0  # PONGs
        self._settle(conn)

    def _settle(self, conn: Connection) -> None:
        """After parsing: PONGs out, selector interest updated."""
        if conn.out:
            self._flush(conn)
        else:
            self._interest(conn)

    def _admit(self, conn: Connection, size: int) -> int:
        lim = self.limits
        if size > lim.max_message_bytes:  # one frame over it: not even thrown away
            raise Dropped("message_bytes", f"a frame of {size} bytes, over the limit of "
                          f"{lim.max_message_bytes} (ps serve --max-message-bytes)")
        if conn.incomplete + size > lim.max_message_bytes:
            self.refused += 1  # no longer held: thrown away, then answered with an error
            self.held -= conn.incomplete
            return REFUSE
        if conn.held + size > lim.max_message_bytes:
            return PAUSE  # its earlier messages are answered first
        if self.held + size > lim.max_pending_bytes:
            if conn.messages:
                return PAUSE
            raise Dropped("pending_bytes", f"{self.held + size} request bytes held on all "
                          f"connections, over the limit of {lim.max_pending_bytes} (ps serve "
                          "--max-pending-bytes)")
        self.held += size
        return ADMIT

    def _flush(self, conn: Connection) -> None:
        try:
            self.queued -= conn.flush(time.monotonic())
        except OSError:
            self._close(conn)
            return
        self._interest(conn)

    def _interest(self, conn: Connection) -> None:
        over = conn.queued >= self.limits.max_queued_reply_bytes
        if over and not conn.over_cap:
            self.backpressured += 1
        conn.over_cap = over
        events = (0 if conn.paused or over else _READ) | (_WRITE if conn.out else 0)
        if events == conn.events:
            return
        if conn.events == 0:
            self.sel.register(conn.sock, events, conn)
        elif events == 0:
            self.sel.unregister(conn.sock)
        else:
            self.sel.modify(conn.sock, events, conn)
        conn.events = events

    def _sweep(self, now: float) -> None:
        """Drop connections past the handshake or stall timeouts; refresh the counters."""
        stall = self.limits.stall_timeout_s
        for conn in list(self.conns.values()):
            if not conn.ready and now - conn.opened_at > HANDSHAKE_S:
                self._drop(conn, "handshake_timeout", f"no ZMTP handshake within {HANDSHAKE_S:g} s")
            elif conn.over_cap and now - conn.progress_at > stall:
                self._drop(conn, "reply_stalled", f"{conn.queued} reply bytes queued (over ps "
                           f"serve --max-queued-reply-bytes {self.limits.max_queued_reply_bytes}) "
                           f"and none sent for {stall:g} s (ps serve --stall-timeout-s)")
            elif (conn.incomplete or conn.body is not None or conn.refusing) and not conn.paused \
                    and now - conn.read_at > stall:
                self._drop(conn, "request_stalled", f"an incomplete message of {conn.incomplete} "
                           f"bytes and no byte for {stall:g} s (ps serve --stall-timeout-s)")

    def _close(self, conn: Connection) -> None:
        """Forget a connection and free all it held."""
        if conn.closed:
            return
        self.held -= conn.held
        self.queued -= conn.queued
        if conn.events:
            self.sel.unregister(conn.sock)
            conn.events = 0
        conn.release()
        self.conns.pop(conn.ident, None)

    def _drop(self, conn: Connection, reason: str, detail: str) -> None:
        self._close(conn)
        self._count_drop(reason, f"dropped a connection: {detail}")

    def _count_drop(self, reason: str, text: str) -> None:
        self.drops[reason] = n = self.drops.get(reason, 0) + 1
        if n <= _LOGGED_DROPS or n % 1000 == 0:
            print(f"cosparse ps: {text} ({reason} drop #{n})", file=sys.stderr, flush=True)
