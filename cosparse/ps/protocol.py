"""Wire format of the parameter server: a fixed binary header plus raw numpy array frames.

A message is a list of ZeroMQ frames::

    [header, text, array_0, ..., array_{n-1}] (+ [mac] when the HMAC flag is set)

* ``header`` is ``HEADER`` (32 bytes, little endian) followed by one ``DESC`` (24 bytes) per array:
  magic ``b"CSPS"``, format version, op code, flags, request id, a signed 64-bit argument (the
  step of a push, the write counter of a pull reply, the shard index of a pong), an error code,
  the number of arrays, and per array its dtype code, rank (1 or 2) and shape.
* ``text`` is UTF-8: a table name (``NAMESPACE/TABLE``; a bare ``TABLE`` is in namespace
  ``default``, see ``namespaces``), a snapshot name, a namespace (CLEAR), a JSON document
  (REGISTER, STATS) or an error message. At most ``MAX_TEXT`` bytes.
* each array frame holds exactly ``prod(shape) * itemsize`` bytes, read with ``np.frombuffer``
  (zero copy, read-only).
* ``mac`` (only with ``FLAG_HMAC``): HMAC-SHA256, with a shared secret, of the session nonce and
  of every preceding frame, each prefixed by its length.

Sessions (HMAC mode): a client first sends HELLO with a fresh random 16-byte client nonce (MACed
with an empty session; its text names the client's namespace, whose key MACs it on a shard with
``ps serve --namespaces``); the shard answers with a fresh random 16-byte session nonce, MACed under
the client nonce (so an old HELLO reply cannot be fed to the client). Every later request on that
connection is MACed under the session nonce, and its request id is a counter that must grow
strictly on the connection: the shard keeps (nonce, last counter) per ZeroMQ routing identity,
which is new for every connection. A replayed, reordered or cross-connection message therefore
fails the MAC or the counter check. Replies are MACed under the same nonce, and the header's
``FLAG_REPLY`` bit (covered by the MAC) keeps a reply from passing as a request.

Nothing that arrives from the network is unpickled, ever: ``decode`` validates every field (shapes
and sizes before any array is built) and raises ``ProtocolError`` (with the error code to reply
with) on anything malformed.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass, field

import numpy as np

MAGIC = b"CSPS"
VERSION = 1

# header: magic, version, op, flags, request id, arg, error, n_arrays, reserved
HEADER = struct.Struct("<4sBBHQqHHI")
# per array: dtype code, ndim, 6 pad bytes, shape[0], shape[1]
DESC = struct.Struct("<BB6xQQ")
MAX_ARRAYS = 8
MAX_TEXT = 1 << 16
MAX_ELEMENTS = 1 << 34
MAX_DIM0 = 1 << 32  # any array's first dimension (rows), whatever its byte size
MAX_DIM1 = 1 << 16  # the second dimension of a 2-D array (row width); zero is refused
NONCE_BYTES = 16  # client and session nonces (HMAC mode)
# a request of at most this many rows and row bytes fits any shard's limits (their floor)
SMALL_REQUEST_ROWS = 4096
SMALL_REQUEST_BYTES = 1 << 20
MIN_MESSAGE_LIMIT = 2 << 20  # the smallest --max-message-bytes: a small request plus its text

# --- op codes ---------------------------------------------------------------------------------
OP_NONE = 0  # only in error replies to requests whose op could not be read
OP_PING = 1
OP_REGISTER = 2
OP_PULL = 3
OP_PUSH = 4
OP_PUSH_ROWS = 5
OP_SNAPSHOT = 6
OP_STATS = 7
OP_DUMP = 8  # every row of a table with its state: (ids, rows)
OP_HELLO = 9  # HMAC mode: open a session (client nonce in, session nonce out)
OP_CLEAR = 10  # drop every table of one namespace (``cosparse train --fresh``; ``run_ids``)
OP_NAMES = {OP_PING: "PING", OP_REGISTER: "REGISTER", OP_PULL: "PULL", OP_PUSH: "PUSH",
            OP_PUSH_ROWS: "PUSH_ROWS", OP_SNAPSHOT: "SNAPSHOT", OP_STATS: "STATS", OP_DUMP: "DUMP",
            OP_HELLO: "HELLO", OP_CLEAR: "CLEAR"}

# --- flags ------------------------------------------------------------------------------------
FLAG_REPLY = 1 << 0
FLAG_WITH_STATE = 1 << 1  # PULL: rows carry the optimizer state after the values
FLAG_INCREMENTAL = 1 << 2  # SNAPSHOT: only rows dirtied since the last snapshot
FLAG_HMAC = 1 << 3  # a trailing HMAC-SHA256 frame
FLAG_PEEK = 1 << 4  # PULL: unknown IDs read their initial value and are not created (version -1)
KNOWN_FLAGS = FLAG_REPLY | FLAG_WITH_STATE | FLAG_INCREMENTAL | FLAG_HMAC | FLAG_PEEK

# --- error codes ------------------------------------------------------------------------------
E_OK = 0
E_BAD_FRAME = 1
E_BAD_VERSION = 2
E_UNKNOWN_OP = 3
E_BAD_DTYPE = 4
E_UNKNOWN_TABLE = 5
E_NOT_OWNER = 6
E_AUTH = 7
E_BAD_REQUEST = 8
E_INTERNAL = 9
E_LIMIT = 10  # over one of the shard's limits (message size, rows per request, table shape)
E_SESSION = 11  # HMAC mode: no session on this connection (send HELLO first)
E_FULL = 12  # the shard's row budget (ps serve --max-rows) is full
E_QUOTA = 13  # the namespace's quota on the shard is reached
E_DENIED = 14  # the session's namespace may not touch that table (ps serve --namespaces)
E_NONFINITE = 15  # a PUSH refused whole: its gradients or its result would be NaN or infinite
ERROR_NAMES = {E_OK: "ok", E_BAD_FRAME: "bad frame", E_BAD_VERSION: "bad version",
               E_UNKNOWN_OP: "unknown op", E_BAD_DTYPE: "bad dtype", E_UNKNOWN_TABLE: "unknown table",
               E_NOT_OWNER: "ID not owned by this shard", E_AUTH: "authentication failed",
               E_BAD_REQUEST: "bad request", E_INTERNAL: "internal error",
               E_LIMIT: "over a limit", E_SESSION: "no session", E_FULL: "shard full",
               E_QUOTA: "over the namespace's quota", E_DENIED: "access denied",
               E_NONFINITE: "non-finite update refused"}

# --- dtypes -----------------------------------------------------------------------------------
DTYPES: dict[int, np.dtype] = {1: np.dtype("<f4"), 2: np.dtype("<i8"), 3: np.dtype("<i4"),
                               4: np.dtype("<f8"), 5: np.dtype("<u8"), 6: np.dtype("u1")}
DTYPE_CODES = {dt: code for code, dt in DTYPES.items()}


class ProtocolError(ValueError):
    """A malformed or unacceptable message; ``code`` is the error code to reply with."""

    def __init__(self, code: int, message: str, request_id: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.request_id = request_id


@dataclass
class Message:
    """One decoded (or to-be-encoded) message."""

    op: int
    request_id: int = 0
    flags: int = 0
    arg: int = 0
    error: int = E_OK
    text: str = ""
    arrays: list[np.ndarray] = field(default_factory=list)


def mac(key: bytes, session: bytes, frames: list) -> bytes:
    """HMAC-SHA256 of the session nonce and the frames, each prefixed by its length."""
    h = hmac.new(key, digestmod=hashlib.sha256)
    h.update(struct.pack("<Q", len(session)))
    h.update(session)
    for f in frames:
        mv = memoryview(f)
        h.update(struct.pack("<Q", mv.nbytes))
        h.update(mv)
    return h.digest()


def encode(msg: Message, key: bytes | None = None, session: bytes = b"") -> list:
    """Frames of ``msg`` (arrays are sent from their own buffers: no copy when contiguous).

    With ``key``, a trailing HMAC frame covers ``session`` (the connection's nonce) and the frames.
    """
    if len(msg.arrays) > MAX_ARRAYS:
        raise ValueError(f"at most {MAX_ARRAYS} arrays per message")
    flags = msg.flags | (FLAG_HMAC if key is not None else 0)
    if key is None:
        flags &= ~FLAG_HMAC
    parts = [HEADER.pack(MAGIC, VERSION, msg.op, flags, msg.request_id, msg.arg, msg.error,
                         len(msg.arrays), 0)]
    bodies = []
    for a in msg.arrays:
        dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
        if dt not in DTYPE_CODES:
            raise ValueError(f"dtype {a.dtype} cannot be sent")
        if a.ndim not in (1, 2):
            raise ValueError("only 1-D and 2-D arrays can be sent")
        shape = (a.shape[0], a.shape[1] if a.ndim == 2 else 0)
        parts.append(DESC.pack(DTYPE_CODES[dt], a.ndim, *shape))
        bodies.append(np.ascontiguousarray(a, dtype=dt))
    text = msg.text.encode("utf-8")
    if len(text) > MAX_TEXT:
        raise ValueError("text frame too long")
    frames: list = [b"".join(parts), text, *bodies]
    if key is not None:
        frames.append(mac(key, session, frames))
    return frames


def decode(frames: list, key: bytes | None = None, session: bytes = b"") -> Message:
    """Validate and decode frames (bytes, memoryviews or zmq.Frame); arrays are zero-copy views.

    With ``key``, the HMAC frame is required and checked (constant-time compare) under ``session``.
    Every shape is checked against the frame sizes before any array is built.
    """
    bufs = [f.buffer if hasattr(f, "buffer") else memoryview(f) for f in frames]
    if not bufs or bufs[0].nbytes < HEADER.size:
        raise ProtocolError(E_BAD_FRAME, f"message has no {HEADER.size}-byte header")
    head = bufs[0]
    magic, version, op, flags, rid, arg, error, n_arrays, _ = HEADER.unpack_from(head, 0)
    if magic != MAGIC:
        raise ProtocolError(E_BAD_FRAME, "bad magic")
    if version != VERSION:
        raise ProtocolError(E_BAD_VERSION, f"protocol version {version}, expected {VERSION}", rid)
    if flags & ~KNOWN_FLAGS:
        raise ProtocolError(E_BAD_FRAME, f"unknown flags {flags:#x}", rid)
    if n_arrays > MAX_ARRAYS:
        raise ProtocolError(E_BAD_FRAME, f"{n_arrays} arrays, at most {MAX_ARRAYS}", rid)
    if head.nbytes != HEADER.size + n_arrays * DESC.size:
        raise ProtocolError(E_BAD_FRAME, "header length does not match its array count", rid)
    has_mac = bool(flags & FLAG_HMAC)
    want = 2 + n_arrays + (1 if has_mac else 0)
    if len(bufs) != want:
        raise ProtocolError(E_BAD_FRAME, f"{len(bufs)} frames, expected {want}", rid)
    if key is not None:
        if not has_mac:
            raise ProtocolError(E_AUTH, "message is not authenticated (no HMAC)", rid)
        if bufs[-1].nbytes != hashlib.sha256().digest_size:
            raise ProtocolError(E_AUTH, f"HMAC frame of {bufs[-1].nbytes} bytes", rid)
        if not hmac.compare_digest(mac(key, session, bufs[:-1]), bytes(bufs[-1])):
            raise ProtocolError(E_AUTH, "HMAC does not match", rid)
    if op not in OP_NAMES and not (op == OP_NONE and flags & FLAG_REPLY):
        raise ProtocolError(E_UNKNOWN_OP, f"unknown op code {op}", rid)
    if bufs[1].nbytes > MAX_TEXT:
        raise ProtocolError(E_BAD_FRAME, "text frame too long", rid)
    try:
        text = bytes(bufs[1]).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProtocolError(E_BAD_FRAME, "text frame is not UTF-8", rid) from e
    arrays = []
    for i in range(n_arrays):
        code, ndim, s0, s1 = DESC.unpack_from(head, HEADER.size + i * DESC.size)
        if code not in DTYPES:
            raise ProtocolError(E_BAD_DTYPE, f"array {i}: unknown dtype code {code}", rid)
        if ndim not in (1, 2) or (ndim == 1 and s1 != 0):
            raise ProtocolError(E_BAD_FRAME, f"array {i}: bad rank {ndim}", rid)
        # bound every dimension on its own: a zero in one must not let the other be anything
        if s0 > MAX_DIM0 or (ndim == 2 and not 1 <= s1 <= MAX_DIM1):
            raise ProtocolError(E_BAD_FRAME, f"array {i}: shape ({s0}, {s1}) is out of bounds "
                                             f"(rows <= {MAX_DIM0}, width 1..{MAX_DIM1})", rid)
        shape = (s0,) if ndim == 1 else (s0, s1)
        n = s0 * (s1 if ndim == 2 else 1)
        if n > MAX_ELEMENTS:
            raise ProtocolError(E_BAD_FRAME, f"array {i}: too large", rid)
        dt = DTYPES[code]
        buf = bufs[2 + i]
        if buf.nbytes != n * dt.itemsize:
            raise ProtocolError(
                E_BAD_FRAME, f"array {i}: {buf.nbytes} bytes, shape {shape} needs {n * dt.itemsize}",
                rid)
        try:
            arrays.append(np.frombuffer(buf, dtype=dt).reshape(shape))
        except ValueError as e:  # unreachable after the checks above; never escapes as non-protocol
            raise ProtocolError(E_BAD_FRAME, f"array {i}: shape {shape}: {e}", rid) from e
    return Message(op=op, request_id=rid, flags=flags & ~FLAG_HMAC, arg=arg, error=error,
                   text=text, arrays=arrays)


def peek_header(frames: list) -> tuple[int, int, int] | None:
    """(op, flags, request id) of a message's header without validating the rest; None when the
    first frame is not a header."""
    try:
        head = frames[0].buffer if hasattr(frames[0], "buffer") else memoryview(frames[0])
        if head.nbytes >= HEADER.size and bytes(head[:4]) == MAGIC:
            _, _, op, flags, rid, _, _, _, _ = HEADER.unpack_from(head, 0)
            return int(op), int(flags), int(rid)
    except Exception:  # noqa: BLE001 - any garbage: no header
        pass
    return None


def peek_request_id(frames: list) -> int:
    """Best-effort request id of a message that failed to decode (0 when unreadable)."""
    try:
        head = frames[0].buffer if hasattr(frames[0], "buffer") else memoryview(frames[0])
        if head.nbytes >= HEADER.size and bytes(head[:4]) == MAGIC:
            return int(HEADER.unpack_from(head, 0)[4])
    except Exception:  # noqa: BLE001 - any garbage: no id
        pass
    return 0


def frames_nbytes(frames: list) -> int:
    """Total bytes of frames (headers included), for the link byte counters."""
    total = 0
    for f in frames:
        total += f.buffer.nbytes if hasattr(f, "buffer") else memoryview(f).nbytes
    return total


# --- shard ownership ----------------------------------------------------------------------------
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix64(ids: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser on int64 IDs (as uint64), same as ``cosparse.store.kernels.mix64``."""
    x = np.ascontiguousarray(ids, dtype=np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        return x ^ (x >> np.uint64(31))


def shard_of(ids: np.ndarray, num_shards: int) -> np.ndarray:
    """Owning shard of every ID: ``mix64(id) % num_shards`` (int64)."""
    if num_shards == 1:
        return np.zeros(np.asarray(ids).shape[0], dtype=np.int64)
    return (mix64(ids) % np.uint64(num_shards)).astype(np.int64)
