"""A raw peer of a PS shard for the security and fuzz tests: one DEALER connection that sends
any frames and reads one reply. With the shard's HMAC key it opens a session (HELLO) and can MAC
hostile frames under it, so they get past authentication to the parsing behind it."""

from __future__ import annotations

import os

import numpy as np
import zmq

from cosparse.ps import protocol as P


class RawPeer:
    def __init__(self, endpoint: str, key: bytes | None = None, timeout_s: float = 10.0) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, int(timeout_s * 1000))
        self.sock.connect(endpoint)
        self.key = key
        self.session = b""
        self.counter = 1 << 40  # request ids: the HMAC session's counter
        if key is not None:
            self.hello()

    def hello(self) -> None:
        nonce = os.urandom(P.NONCE_BYTES)
        msg = P.Message(P.OP_HELLO, request_id=self._next(),
                        arrays=[np.frombuffer(nonce, dtype=np.uint8)])
        self.sock.send_multipart(P.encode(msg, self.key))
        rep = P.decode(self.sock.recv_multipart(), self.key, nonce)
        assert rep.error == P.E_OK, rep.text
        self.session = rep.arrays[0].tobytes()

    def _next(self) -> int:
        self.counter += 1
        return self.counter

    def authenticate(self, frames: list[bytes]) -> list[bytes]:
        """With a key: the next counter as request id, the HMAC flag, and a MAC under this
        session (a first frame that is no header is left alone, and gets no MAC)."""
        if self.key is None or not frames or len(frames[0]) < P.HEADER.size \
                or frames[0][:4] != P.MAGIC:
            return frames
        head = bytearray(frames[0])
        flags = int.from_bytes(head[6:8], "little") | P.FLAG_HMAC
        head[6:8] = flags.to_bytes(2, "little")
        head[8:16] = self._next().to_bytes(8, "little")
        out = [bytes(head), *frames[1:]]
        return [*out, P.mac(self.key, self.session, out)]

    def send(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)

    def recv(self) -> P.Message | None:
        """The next reply (decoded without checking its MAC), or None after the timeout."""
        try:
            return P.decode(self.sock.recv_multipart())
        except zmq.Again:
            return None

    def request(self, msg: P.Message) -> P.Message | None:
        """A well-formed request (MACed under the session with a key)."""
        msg.request_id = self._next()
        self.send([bytes(f) for f in P.encode(msg, self.key, self.session)])
        return self.recv()

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()

    def __enter__(self) -> RawPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RawZmtpPeer:
    """A peer that speaks ZMTP 3.1 (NULL) over a plain TCP socket, written out here byte by
    byte: unlike a libzmq socket, which sends nothing of a message before its last frame, it
    can send frames with MORE and never end the message."""

    def __init__(self, endpoint: str, timeout_s: float = 5.0) -> None:
        import socket

        host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        greeting = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x01" + b"NULL".ljust(20, b"\0") + b"\0" * 32
        ready = b"\x05READY" + b"\x0bSocket-Type" + (6).to_bytes(4, "big") + b"DEALER"
        self.sock.sendall(greeting + bytes((0x04, len(ready))) + ready)

    def send_frame(self, payload: bytes, more: bool = True) -> bool:
        """One message frame (long form); False once the shard has closed the connection."""
        try:
            self.sock.sendall(bytes((0x02 | (0x01 if more else 0),))
                              + len(payload).to_bytes(8, "big") + payload)
            return True
        except OSError:
            return False

    def close(self) -> None:
        self.sock.close()
