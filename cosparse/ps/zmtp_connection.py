"""One peer connection of the shard's ZMTP transport: what it has read, what it still has to send.

Reading: bytes arrive in a fixed receive buffer and are parsed frame by frame (``zmtp``). A frame
over ``SMALL_FRAME`` bytes is read straight into an array of its own size (``recv_into``, no
copy), but only after ``admit`` (the transport's bounds) has accepted its announced size, so the
bytes held for a message are known before they are read. Complete messages wait in ``messages``
until the serving loop answers them. Sending: a queue of memoryviews (each holds its reply's
buffer alive until the kernel has taken its bytes: ``ReplyBuffers`` cannot reuse a buffer still
queued), written with scatter/gather ``sendmsg`` and partial sends resumed.
"""

from __future__ import annotations

import socket
import time
from collections import deque
from collections.abc import Callable
from itertools import islice

import numpy as np

from cosparse.ps import zmtp

SMALL_FRAME = 1 << 16  # frames up to this size are copied out of the receive buffer
RECV_BUFFER = 1 << 18  # a whole small frame (and its header) always fits
MAX_FRAMES = 16  # per message: header, text, 8 arrays, MAC, and some slack
_IOV = 512  # buffers per sendmsg (under IOV_MAX)


class Dropped(Exception):
    """The connection broke a bound (``reason`` is the STATS key) and is closed."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


# admit(connection, frame bytes): ADMIT (held from now on), PAUSE (wait for answers), or REFUSE
# (the message passes --max-message-bytes: the transport has released what it held)
ADMIT, PAUSE, REFUSE = 1, 0, -1
Admit = Callable[["Connection", int], int]
_HEAD_KEPT = 4096  # a refused message keeps its first frame up to this size (its header)
_ONE_BYTE = np.zeros(1, dtype=np.uint8)


class Connection:
    """A peer's socket, its parse state, its unanswered messages and its send queue."""

    def __init__(self, sock: socket.socket, ident: bytes, now: float, limit: int) -> None:
        self.sock = sock
        self._limit = limit  # --max-message-bytes
        self.ident = ident  # unique per connection: the HMAC sessions' key
        self.rbuf = bytearray(RECV_BUFFER)
        self.rview = memoryview(self.rbuf)
        self.rpos = self.wpos = 0  # unparsed bytes: rbuf[rpos:wpos]
        self.greeted = False  # the peer's greeting was read
        self.ready = False  # READY exchanged: message frames may follow
        self.opened_at = now
        self.read_at = now  # last time bytes arrived
        self.frames: list = []  # the message being read
        self.incomplete = 0  # its bytes (frames admitted, including one still being read)
        self.messages: deque[tuple[list, int]] = deque()  # complete, unanswered: (frames, bytes)
        self.message_bytes = 0
        self.body: np.ndarray | None = None  # a large frame being read straight into place
        self.body_got = 0
        self.body_more = False
        self.paused = False  # the next frame waits until messages are answered
        # a message over the limit: its frames are read and thrown away (up to twice the limit
        # in all), and it is answered with an error once it ends
        self.refusing = False
        self.discard_left = 0  # bytes it may still throw away
        self.skip = 0  # bytes of the current frame still to throw away
        self.skip_more = False
        self.discarded = 0
        self.out: deque[memoryview] = deque()
        self.queued = 0  # bytes in ``out``
        self.progress_at = now  # last time the queue was empty or the kernel took bytes
        self.events = 0  # selector events registered
        self.over_cap = False  # its reply queue is over the cap (reading stopped)
        self.closed = False

    @property
    def held(self) -> int:
        """Request bytes held: the incomplete message and the unanswered ones."""
        return self.incomplete + self.message_bytes

    # --- reading --------------------------------------------------------------------------
    def read(self, admit: Admit, now: float) -> bool:
        """One receive and the parsing of what it brought; False when the peer closed."""
        if self.skip:  # a refused message's frame: read into the (empty) buffer, thrown away
            n = self.sock.recv_into(self.rview[: min(self.skip, RECV_BUFFER)])
            if n == 0:
                return False
            self.read_at = now
            self.skip -= n
            if not self.skip:
                self._end_frame(self.skip_more)
                self.parse(admit)
            return True
        if self.body is not None:
            mv = memoryview(self.body)[self.body_got :]
            n = self.sock.recv_into(mv)
            if n == 0:
                return False
            self.read_at = now
            self.body_got += n
            if self.body_got < self.body.nbytes:
                return True
            body, self.body = self.body, None
            self._frame(memoryview(body).toreadonly(), self.body_more)
            self.parse(admit)
            return True
        if self.rpos == self.wpos:
            self.rpos = self.wpos = 0
        elif RECV_BUFFER - self.wpos < SMALL_FRAME + 9:  # room for a whole small frame
            n = self.wpos - self.rpos
            self.rbuf[:n] = self.rview[self.rpos : self.wpos]
            self.rpos, self.wpos = 0, n
        n = self.sock.recv_into(self.rview[self.wpos :])
        if n == 0:
            return False
        self.read_at = now
        self.wpos += n
        self.parse(admit)
        return True

    def parse(self, admit: Admit) -> None:
        """Parse the buffered bytes into frames until a frame is incomplete or must wait."""
        buf, pos, end = self.rbuf, self.rpos, self.wpos
        try:
            while not self.paused and self.body is None and not self.skip:
                if not self.greeted:
                    if end - pos < zmtp.GREETING_BYTES:
                        break
                    zmtp.check_greeting(self.rview[pos : pos + zmtp.GREETING_BYTES])
                    pos += zmtp.GREETING_BYTES
                    self.greeted = True
                    continue
                head = zmtp.parse_frame_header(buf, pos, end)
                if head is None:
                    break
                flags, size, hlen = head
                start = pos + hlen
                if flags & zmtp.FLAG_COMMAND:
                    if size > zmtp.MAX_COMMAND_BYTES:
                        raise zmtp.ZmtpError(f"command frame of {size} bytes")
                    if end - start < size:
                        break
                    pos = start + size
                    self._command(bytes(buf[start:pos]))
                    continue
                if not self.ready:
                    raise zmtp.ZmtpError("a message frame before READY")
                if size <= SMALL_FRAME and end - start < size:
                    break  # the rest of a small frame: it fits the buffer
                if len(self.frames) >= MAX_FRAMES:
                    raise Dropped("frames", f"a message of over {MAX_FRAMES} frames")
                more = bool(flags & zmtp.FLAG_MORE)
                verdict = ADMIT if self.refusing else admit(self, size)
                if verdict == PAUSE:
                    self.paused = True
                    break
                if verdict == REFUSE:
                    self._refuse()
                if self.refusing:
                    if size > self.discard_left:
                        raise Dropped("message_bytes", "a message far over ps serve "
                                      f"--max-message-bytes ({self.discarded + size} bytes "
                                      "thrown away)")
                    self.discard_left -= size
                    self.discarded += size
                    have = min(size, end - start)
                    pos = start + have
                    self.skip, self.skip_more = size - have, more
                    if not self.skip:
                        self._end_frame(more)
                    continue
                self.incomplete += size
                if size <= SMALL_FRAME:
                    pos = start + size
                    self._frame(bytes(buf[start:pos]), bool(flags & zmtp.FLAG_MORE))
                    continue
                body = np.empty(size, dtype=np.uint8)
                have = min(size, end - start)
                body[:have] = np.frombuffer(buf, dtype=np.uint8, count=have, offset=start)
                pos = start + have
                if have == size:
                    self._frame(memoryview(body).toreadonly(), bool(flags & zmtp.FLAG_MORE))
                    continue
                self.body, self.body_got, self.body_more = body, have, bool(flags & zmtp.FLAG_MORE)
        finally:
            self.rpos = pos

    def _refuse(self) -> None:
        """Stop holding the message: keep its header frame, throw the rest away."""
        head = self.frames[0] if self.frames and len(self.frames[0]) <= _HEAD_KEPT else None
        self.discarded = self.incomplete - (len(head) if head is not None else 0)
        self.frames = [head] if head is not None else []
        self.incomplete = 0  # (the header kept is not counted: at most _HEAD_KEPT bytes)
        # the whole message may reach twice the limit before the connection is dropped
        self.refusing, self.discard_left = True, 2 * self._limit - self.discarded

    def _end_frame(self, more: bool) -> None:
        """A refused message's frame was thrown away; at its end, the message goes on with a
        stand-in of the thrown-away bytes (one byte repeated, nothing held) for the reply."""
        self.frames.append(None)
        if more:
            return
        kept = [f for f in self.frames if f is not None]
        stand_in = np.broadcast_to(_ONE_BYTE, (self.discarded,))
        self.frames, self.refusing, self.discarded = kept, False, 0
        self._frame(memoryview(stand_in), False)

    def _frame(self, frame: bytes | memoryview, more: bool) -> None:
        self.frames.append(frame)
        if not more:
            self.messages.append((self.frames, self.incomplete))
            self.message_bytes += self.incomplete
            self.frames, self.incomplete = [], 0

    def _command(self, body: bytes) -> None:
        name, data = zmtp.parse_command(body)
        if name == b"READY":
            if self.ready:
                raise zmtp.ZmtpError("a second READY")
            zmtp.check_ready(data)
            self.ready = True
        elif name == b"PING":
            self.queue([memoryview(zmtp.pong(data))])
        elif name == b"ERROR":
            raise zmtp.ZmtpError("the peer sent ERROR")
        # anything else (PONG, SUBSCRIBE, ...) means nothing to a ROUTER: ignored

    def take_message(self) -> tuple[list, int]:
        """The oldest unanswered message as ``[identity, *frames]`` and its bytes."""
        frames, nbytes = self.messages.popleft()
        self.message_bytes -= nbytes
        return [self.ident, *frames], nbytes

    # --- sending --------------------------------------------------------------------------
    def queue(self, bufs: list[memoryview]) -> int:
        """Queue byte buffers to send; their total."""
        if not self.out:
            self.progress_at = time.monotonic()  # the stall clock starts with the queue
        n = sum(b.nbytes for b in bufs)
        self.out.extend(bufs)
        self.queued += n
        return n

    def flush(self, now: float) -> int:
        """Send what the kernel takes now; the bytes sent (raises OSError on a dead peer)."""
        out, sent = self.out, 0
        while out:
            chunk = list(islice(out, 0, _IOV))
            try:
                n = self.sock.sendmsg(chunk)
            except (BlockingIOError, InterruptedError):
                break
            sent += n
            full = n < sum(b.nbytes for b in chunk)  # the kernel took less: its buffer is full
            while n:
                head = out[0]
                if n >= head.nbytes:
                    out.popleft()
                    n -= head.nbytes
                else:
                    out[0] = head[n:]
                    n = 0
            if full:
                break
        if sent:
            self.progress_at = now
        self.queued -= sent
        return sent

    def release(self) -> None:
        """Close the socket and drop everything held (buffers are freed at once)."""
        self.closed = True
        self.out.clear()
        self.messages.clear()
        self.frames, self.body = [], None
        self.queued = self.incomplete = self.message_bytes = 0
        try:
            self.sock.close()
        except OSError:
            pass
