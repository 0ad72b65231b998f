"""ZMTP 3.1 (RFC 37/ZMTP, RFC 23) wire codec for the shard's own server transport, NULL mechanism.

Why this is hand-written: libzmq cannot bound a multipart message's bytes. ``MAXMSGSIZE`` is
checked per frame, and the frames of an incomplete message sit in libzmq's pipe, invisible to the
application, until the last one arrives; so a peer that sends large frames with MORE and never
ends its message grows a libzmq ROUTER without bound. Speaking the (small) wire protocol ourselves
lets ``transport`` see every frame header before it reads the frame, and refuse it there.

Only what a ROUTER that talks to libzmq DEALER/REQ peers needs is here: the 64-byte greeting
(version 3.1, mechanism NULL, as-server 0), the READY command with its properties, PING/PONG, and
frame headers (flags MORE/LONG/COMMAND, a 1- or 8-byte size). Parsing is pure (no sockets).
"""

from __future__ import annotations

import struct

GREETING_BYTES = 64
FLAG_MORE = 0x01
FLAG_LONG = 0x02
FLAG_COMMAND = 0x04
_KNOWN_FLAGS = FLAG_MORE | FLAG_LONG | FLAG_COMMAND
MAX_COMMAND_BYTES = 1 << 16  # READY with its properties, PING: all far smaller
PEER_TYPES = (b"DEALER", b"REQ")  # the socket types that may talk to our ROUTER
_LONG_SIZE = struct.Struct(">Q")
_PROP_VALUE = struct.Struct(">I")


class ZmtpError(ValueError):
    """The peer broke the protocol; the connection is closed."""


def greeting() -> bytes:
    """Our greeting: signature, version 3.1, mechanism NULL, as-server 0 (NULL has no roles)."""
    return b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x01" + b"NULL".ljust(20, b"\0") + b"\0" * 32


def check_greeting(data: bytes | memoryview) -> None:
    """Refuse a peer greeting that is not ZMTP 3.x with the NULL mechanism."""
    g = bytes(data[:GREETING_BYTES])
    if len(g) < GREETING_BYTES or g[0] != 0xFF or g[9] != 0x7F:
        raise ZmtpError("not a ZMTP 3 greeting")
    if g[10] < 3:
        raise ZmtpError(f"ZMTP version {g[10]}.{g[11]}: 3.x is required")
    mechanism = g[12:32].rstrip(b"\0")
    if mechanism != b"NULL":
        raise ZmtpError(f"security mechanism {mechanism!r}: this shard speaks NULL only (the "
                        "client needs --auth-key or no auth, not CURVE)")


def frame_header(size: int, more: bool = False, command: bool = False) -> bytes:
    """The flags byte and size of one frame (short form up to 255 bytes)."""
    flags = (FLAG_MORE if more else 0) | (FLAG_COMMAND if command else 0)
    if size <= 255:
        return bytes((flags, size))
    return bytes((flags | FLAG_LONG,)) + _LONG_SIZE.pack(size)


def parse_frame_header(buf: bytes | bytearray | memoryview, pos: int, end: int
                       ) -> tuple[int, int, int] | None:
    """(flags, body size, header length) of the frame at ``buf[pos:end]``, or None when its
    header is not complete yet."""
    if end - pos < 2:
        return None
    flags = buf[pos]
    if flags & ~_KNOWN_FLAGS:
        raise ZmtpError(f"reserved frame flag bits set ({flags:#x})")
    if flags & FLAG_LONG:
        if end - pos < 9:
            return None
        size = _LONG_SIZE.unpack_from(buf, pos + 1)[0]
        if size >> 63:
            raise ZmtpError("frame size over 2^63")
        return flags, size, 9
    return flags, buf[pos + 1], 2


def command(name: bytes, data: bytes = b"") -> bytes:
    """A whole command frame (header and body)."""
    body = bytes((len(name),)) + name + data
    return frame_header(len(body), command=True) + body


def ready(socket_type: bytes = b"ROUTER") -> bytes:
    """Our READY command frame."""
    return command(b"READY", properties({b"Socket-Type": socket_type}))


def properties(props: dict[bytes, bytes]) -> bytes:
    return b"".join(bytes((len(k),)) + k + _PROP_VALUE.pack(len(v)) + v for k, v in props.items())


def parse_command(body: bytes) -> tuple[bytes, bytes]:
    """(name, data) of a command frame's body."""
    if not body or len(body) < 1 + body[0]:
        raise ZmtpError("truncated command")
    n = body[0]
    return body[1 : 1 + n], body[1 + n :]


def parse_properties(data: bytes) -> dict[bytes, bytes]:
    props, pos = {}, 0
    while pos < len(data):
        n = data[pos]
        if pos + 1 + n + 4 > len(data):
            raise ZmtpError("truncated READY property")
        name = data[pos + 1 : pos + 1 + n]
        (vlen,) = _PROP_VALUE.unpack_from(data, pos + 1 + n)
        start = pos + 1 + n + 4
        if start + vlen > len(data):
            raise ZmtpError("truncated READY property value")
        props[name] = data[start : start + vlen]
        pos = start + vlen
    return props


def check_ready(data: bytes) -> None:
    """Refuse a READY from a socket type that cannot talk to a ROUTER."""
    kind = parse_properties(data).get(b"Socket-Type")
    if kind not in PEER_TYPES:
        raise ZmtpError(f"peer socket type {kind!r}: a shard serves DEALER or REQ sockets")


def pong(ping_data: bytes) -> bytes:
    """The PONG command answering a PING (its 2-byte TTL dropped, its context echoed)."""
    if len(ping_data) < 2:
        raise ZmtpError("PING without its TTL")
    return command(b"PONG", ping_data[2:18])
