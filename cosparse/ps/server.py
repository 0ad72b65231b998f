"""The parameter-server shard process: a ROUTER-side ZeroMQ (ZMTP) endpoint in front of a ``Shard``.

``cosparse ps serve --shard I --num-shards N --bind ADDR:PORT --data-dir DIR`` runs ``serve``.
Requests are handled one at a time, in arrival order; the messages already waiting when a batch
is drained are the queue depth reported by STATS, with the serving thread's CPU seconds per op
(``cpu_s_by_op``: decode, the shard's work, encode and send of each request). Any malformed or
refused request gets an error reply (never a crash). The server binds 127.0.0.1 by default; a
non-loopback bind needs authentication (an HMAC shared secret, ``--auth-key FILE``, or CURVE,
``--curve-secret FILE``).
On start it restores the newest snapshot chain in ``--data-dir``; SNAPSHOT requests write there.

Transport (bounds: see ``transport``): plain and ``--auth-key`` shards speak ZMTP themselves
(``transport``: libzmq cannot bound an incomplete multipart message, and these modes authenticate
a message only once it has arrived); ``--curve-secret`` keeps libzmq's ROUTER (CURVE authenticates
a client before it accepts any frame, so nothing is held before authentication).
Limits: a message over ``--max-message-bytes`` is refused (past twice that, or a single frame over
it, its connection is dropped); rows per request, table shapes and the row budget are
``ShardLimits``. With an HMAC key, every connection opens a session (HELLO) and each request's
counter must grow: see ``protocol``.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml
import zmq  # (its errors: the CURVE transport's)

from cosparse.config import ConfigError
from cosparse.ps import protocol as P
from cosparse.ps.keys import keygen, read_key_file
from cosparse.ps.limits import ShardError, ShardLimits
from cosparse.ps.namespaces import DEFAULT_NAMESPACE, Quota, key_of, split_key
from cosparse.ps.reply_buffers import ReplyBuffers
from cosparse.ps.shard import Shard
from cosparse.ps.snapshot_format import SnapshotError
from cosparse.ps.table_config import NAME_RE, table_config_from_dict
from cosparse.ps.transport import TransportLimits, ZmtpTransport, split_bind

# (re-exported for ``cosparse ps serve`` / ``ps keygen``: they lived here before ``keys``)
__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "ServeOptions", "Server", "keygen", "read_key_file",
           "serve", "split_bind", "tables_from_yaml"]

LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
DEFAULT_MAX_MESSAGE_BYTES = 256 << 20
MAX_SESSIONS = 4096  # HMAC sessions kept (least recently used dropped: that client says HELLO again)
MAX_ERROR_TEXT = 2000
_ERROR_CODES = {"table": P.E_UNKNOWN_TABLE, "owner": P.E_NOT_OWNER, "limit": P.E_LIMIT,
                "full": P.E_FULL, "quota": P.E_FULL}
_COUNTED_OPS = (P.OP_PULL, P.OP_PUSH, P.OP_PUSH_ROWS, P.OP_DUMP)  # accounted per namespace


@dataclass
class ServeOptions:
    shard: int
    num_shards: int
    bind: str = "127.0.0.1:0"
    data_dir: str = "ps-data"
    config: str | None = None
    auth_key: bytes | None = None
    curve_secret: str | None = None
    ready_file: str | None = None
    parent_pid: int | None = None
    restore: str | None = None  # a snapshot name in data_dir; default: the newest
    announce: str | None = None  # TCPStore HOST:PORT where this shard publishes its endpoint
    limits: ShardLimits = field(default_factory=ShardLimits)
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES  # one request, all frames together
    max_pending_bytes: int | None = None  # request bytes held, all connections (4x the above)
    max_queued_reply_bytes: int | None = None  # per connection (default: max_message_bytes)
    stall_timeout_s: float = 60.0  # a connection over a bound that makes no progress is dropped
    shard_threads: int = 1  # numba threads of the PULL/PUSH kernels (each row on one thread)


def tables_from_yaml(path: str | Path) -> list:
    """The ``tables`` section of a cosparse YAML config (other sections are ignored here)."""
    raw = yaml.safe_load(Path(path).read_text()) or {}
    tables = raw.get("tables") if isinstance(raw, dict) else None
    if not isinstance(tables, list):
        raise ConfigError(f"{path}: no 'tables' list")
    return [table_config_from_dict(t) for t in tables]


class Server:
    """The request loop of one shard."""

    def __init__(self, opts: ServeOptions) -> None:
        host, port = split_bind(opts.bind)
        if host not in LOOPBACK and opts.auth_key is None and opts.curve_secret is None:
            raise ValueError(f"--bind {opts.bind}: a non-loopback bind requires authentication "
                             "(--auth-key FILE or --curve-secret FILE)")
        if opts.max_message_bytes < P.MIN_MESSAGE_LIMIT:
            raise ValueError(f"--max-message-bytes {opts.max_message_bytes}: at least "
                             f"{P.MIN_MESSAGE_LIMIT}")
        self.opts = opts
        if opts.shard_threads > 1:
            import numba

            if opts.shard_threads > numba.config.NUMBA_NUM_THREADS:
                raise ValueError(f"--shard-threads {opts.shard_threads}: over NUMBA_NUM_THREADS "
                                 f"({numba.config.NUMBA_NUM_THREADS}); raise it in the environment")
            numba.set_num_threads(opts.shard_threads)
        elif opts.shard_threads < 1:
            raise ValueError(f"--shard-threads {opts.shard_threads}: at least 1")
        self.shard = Shard(opts.shard, opts.num_shards, opts.limits, threads=opts.shard_threads)
        self.data_dir = Path(opts.data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.restored = self.shard.restore(self.data_dir, opts.restore)
        if opts.config:
            self.shard.register(tables_from_yaml(opts.config))
        self.key = opts.auth_key
        # HMAC sessions per connection (routing identity): [session nonce, last request counter]
        self.sessions: OrderedDict[bytes, list] = OrderedDict()
        limits = TransportLimits.derive(opts.max_message_bytes, opts.max_pending_bytes,
                                        opts.max_queued_reply_bytes, opts.stall_timeout_s)
        if opts.curve_secret:
            from cosparse.ps.curve_transport import CurveTransport

            self.transport: ZmtpTransport | CurveTransport = CurveTransport(
                host, port, limits, opts.curve_secret)
        else:
            self.transport = ZmtpTransport(host, port, limits)
        self.endpoint = self.transport.endpoint
        self.running = True
        self.reply_buffers = ReplyBuffers()
        self.stats = {"requests": 0, "errors": 0, "bytes_in": 0, "bytes_out": 0,
                      "queue_depth": 0, "max_queue_depth": 0, "busy_s": 0.0,
                      "cpu_s_by_op": {},  # op name -> this thread's CPU seconds answering it
                      "transport": self.transport.snapshot()}  # connections, drops, bytes held

    # --- loop -------------------------------------------------------------------------------
    def serve_forever(self) -> None:
        if self.opts.announce:
            from cosparse.ps.discovery import announce

            announce(self.opts.announce, self.shard.num_shards, self.shard.index, self.endpoint)
        if self.opts.ready_file:
            tmp = self.opts.ready_file + ".tmp"
            Path(tmp).write_text(self.endpoint)
            os.replace(tmp, self.opts.ready_file)
        gc.collect()
        gc.freeze()  # what start-up built stays out of every later collection
        self.transport.serve(self._handle, self._keep_serving, self._note_depth, self.stats)
        self.close()

    def _keep_serving(self) -> bool:
        """False once SIGTERM/SIGINT arrived or the process that started us is gone."""
        return self.running and not (self.opts.parent_pid and os.getppid() != self.opts.parent_pid)

    def _note_depth(self, depth: int) -> None:
        """Messages ready in one drain of the transport: the queue depth."""
        self.stats["queue_depth"] = depth
        if depth > self.stats["max_queue_depth"]:
            self.stats["max_queue_depth"] = depth

    def close(self) -> None:
        self.transport.close()

    def _handle(self, frames: list) -> None:
        """Answer one message; whatever it holds, this never raises (the shard keeps serving)."""
        t0, c0 = time.perf_counter(), time.thread_time()
        op = P.OP_NONE
        try:
            op = self._handle_one(frames)
        except Exception as e:  # noqa: BLE001 - last resort: log it, keep serving
            self.stats["errors"] += 1
            print(f"cosparse ps: shard {self.shard.index}: could not answer a message: "
                  f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
        self.stats["busy_s"] += time.perf_counter() - t0
        by_op = self.stats["cpu_s_by_op"]
        name = P.OP_NAMES.get(op, "NONE")
        by_op[name] = by_op.get(name, 0.0) + time.thread_time() - c0

    def _handle_one(self, frames: list) -> int:
        """Answer one message; returns its op (``OP_NONE`` when it could not be read)."""
        self.stats["requests"] += 1
        nbytes = P.frames_nbytes(frames)
        self.stats["bytes_in"] += nbytes
        if len(frames) < 2:  # no identity + payload: nothing we can answer
            self.stats["errors"] += 1
            return P.OP_NONE
        ident, body = bytes(frames[0]), frames[1:]
        head = P.peek_header(body)
        op, rid = (head[0], head[2]) if head is not None else (P.OP_NONE, 0)
        if op not in P.OP_NAMES:
            op = P.OP_NONE
        reply_session: bytes | None = None  # the nonce that MACs the reply (None: no MAC)
        req: P.Message | None = None
        try:
            if nbytes - len(ident) > self.opts.max_message_bytes:
                raise P.ProtocolError(P.E_LIMIT, f"message of {nbytes - len(ident)} bytes is over "
                                                 f"shard {self.shard.index}'s limit of "
                                                 f"{self.opts.max_message_bytes} (ps serve "
                                                 "--max-message-bytes)", rid)
            session = b""
            sess: list = []
            if self.key is not None and op != P.OP_HELLO:  # HELLO replies: MACed under its nonce
                sess = self.sessions.get(ident) or []
                if not sess:
                    raise P.ProtocolError(P.E_SESSION, "no session on this connection (a new "
                                                       "or expired one): send HELLO first", rid)
                self.sessions.move_to_end(ident)
                reply_session = session = sess[0]
            req = P.decode(body, self.key, session)
            if req.flags & P.FLAG_REPLY:
                raise P.ProtocolError(P.E_BAD_FRAME, "a reply sent as a request", rid)
            if self.key is not None and op != P.OP_HELLO:
                if req.request_id <= sess[1]:
                    raise P.ProtocolError(P.E_AUTH, f"replayed or reordered request: counter "
                                                    f"{req.request_id}, this connection is at "
                                                    f"{sess[1]}", rid)
                sess[1] = req.request_id
            if op == P.OP_HELLO:
                reply, reply_session = self._hello(req, ident)
            else:
                reply = self._dispatch(req)
        except P.ProtocolError as e:
            reply = self._error(e.code, str(e), e.request_id or rid, op)
        except ShardError as e:
            reply = self._error(_ERROR_CODES.get(e.kind, P.E_BAD_REQUEST), str(e), rid, op)
        except (ConfigError, SnapshotError, ValueError) as e:
            reply = self._error(P.E_BAD_REQUEST, str(e), rid, op)
        except MemoryError as e:
            reply = self._error(P.E_INTERNAL, f"out of memory: {e}", rid, op)
        except Exception as e:  # noqa: BLE001 - the server must stay alive
            reply = self._error(P.E_INTERNAL, f"{type(e).__name__}: {e}", rid, op)
        self._account(req, reply)
        key = self.key if reply_session is not None else None
        out = P.encode(reply, key, reply_session or b"")
        self.stats["bytes_out"] += P.frames_nbytes(out)
        self.transport.send(ident, out)
        return op

    def _hello(self, req: P.Message, ident: bytes) -> tuple[P.Message, bytes | None]:
        """Open this connection's session: a fresh nonce, MACed under the client's nonce."""
        _want(req.arrays, 1, P.OP_HELLO)
        nonce = req.arrays[0]
        if nonce.dtype != np.uint8 or nonce.shape != (P.NONCE_BYTES,):
            raise P.ProtocolError(P.E_BAD_REQUEST, f"HELLO takes a {P.NONCE_BYTES}-byte uint8 nonce")
        rep = P.Message(P.OP_HELLO, request_id=req.request_id, flags=P.FLAG_REPLY,
                        arg=self.shard.index)
        if self.key is None:  # no HMAC: nothing to open (a client with a key refuses this reply)
            return rep, None
        session = os.urandom(P.NONCE_BYTES)
        self.sessions[ident] = [session, req.request_id]
        self.sessions.move_to_end(ident)
        while len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)
        rep.arrays = [np.frombuffer(session, dtype=np.uint8)]
        return rep, nonce.tobytes()

    def _error(self, code: int, text: str, rid: int, op: int) -> P.Message:
        self.stats["errors"] += 1
        if len(text) > MAX_ERROR_TEXT:
            text = text[:MAX_ERROR_TEXT] + "..."
        return P.Message(op=op, request_id=rid, flags=P.FLAG_REPLY, error=code, text=text)

    def _dispatch(self, req: P.Message) -> P.Message:
        op, a = req.op, req.arrays
        rep = P.Message(op=op, request_id=req.request_id, flags=P.FLAG_REPLY)
        sh = self.shard
        if op == P.OP_PING:
            rep.arg = sh.index
            rep.text = json.dumps({"shard": sh.index, "num_shards": sh.num_shards, "pid": os.getpid(),
                                   "max_message_bytes": self.opts.max_message_bytes,
                                   "max_request_rows": sh.limits.max_request_rows})
        elif op == P.OP_REGISTER:
            rep.text = json.dumps(self._register(req.text))
        elif op == P.OP_PULL:
            _want(a, 1, op)
            with_state = bool(req.flags & P.FLAG_WITH_STATE)
            out = self._reply_buffers(req.text, a[0].shape[0], with_state)
            rows, versions, wc = sh.pull(req.text, a[0], with_state,
                                         peek=bool(req.flags & P.FLAG_PEEK), out=out)
            rep.arrays, rep.arg = [rows, versions], wc
            rep.flags |= req.flags & P.FLAG_WITH_STATE
        elif op == P.OP_PUSH:
            _want(a, 2, op)
            rep.arg = sh.push(req.text, a[0], a[1], int(req.arg))
        elif op == P.OP_PUSH_ROWS:
            _want(a, 2, op)
            rep.arg = sh.push_rows(req.text, a[0], a[1])
        elif op == P.OP_SNAPSHOT:
            _want(a, 0, op)
            root = self.data_dir
            if req.text:  # a named sub-directory of the data dir, never an arbitrary path
                if not NAME_RE.match(req.text) or req.text in (".", ".."):
                    raise ShardError("request", f"SNAPSHOT: bad name {req.text!r}")
                root = self.data_dir / req.text
            rep.text = sh.snapshot(root, bool(req.flags & P.FLAG_INCREMENTAL))
            rep.arg = sh.write_counter
        elif op == P.OP_DUMP:
            _want(a, 0, op)
            ids, rows = sh.dump(req.text)
            rep.arrays, rep.arg = [ids, rows], sh.write_counter
        elif op == P.OP_STATS:
            st = sh.stats()
            st.update(self.stats, endpoint=self.endpoint, pid=os.getpid())
            rep.text = json.dumps(st)
        return rep


    def _register(self, text: str) -> list[str]:
        """REGISTER: a JSON list of tables (in ``default``, or each in its ``namespace``), or
        ``{"namespace": NS, "tables": [...], "quota": {rows, bytes} | null}`` from a client of
        namespace NS (its tables default to NS; a quota replaces NS's)."""
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise ShardError("request", f"REGISTER: text is not JSON ({e})") from e
        requester, quota = None, False
        if isinstance(doc, dict):
            requester = doc.get("namespace", DEFAULT_NAMESPACE)
            if not isinstance(requester, str):
                raise ShardError("request", "REGISTER: namespace must be a string")
            split_key(f"{requester}/t")  # a valid namespace name
            if "quota" in doc:
                q = doc["quota"]
                quota = None if q is None else Quota.from_doc(q, self.shard.limits.max_rows)
            doc = doc.get("tables")
        if not isinstance(doc, list) or not all(isinstance(d, dict) for d in doc):
            raise ShardError("request", "REGISTER: expected a JSON list of table objects")
        spaces, cfgs = [], []
        for d in doc:
            d = dict(d)
            ns = d.pop("namespace", requester or DEFAULT_NAMESPACE)
            if not isinstance(ns, str):
                raise ShardError("request", "REGISTER: a table's namespace must be a string")
            cfg = table_config_from_dict(d)
            spaces.append(split_key(key_of(ns, cfg.name))[0])
            cfgs.append(cfg)
        return self.shard.register(cfgs, spaces, requester, quota)

    def _account(self, req: P.Message | None, reply: P.Message) -> None:
        """Count a data request on its namespace (refused ones too)."""
        if req is None or req.op not in _COUNTED_OPS:
            return
        try:
            ns, _ = split_key(req.text)
        except ShardError:
            return
        ok = reply.error == P.E_OK
        nbytes = sum(a.nbytes for a in req.arrays) + sum(a.nbytes for a in reply.arrays)
        rows = int(req.arrays[0].shape[0]) if req.arrays else \
            int(reply.arrays[0].shape[0]) if reply.arrays else 0
        self.shard.book.count(ns, P.OP_NAMES[req.op], rows, nbytes, ok)

    def _reply_buffers(self, table: str, n: int, with_state: bool
                       ) -> tuple[np.ndarray, np.ndarray] | None:
        """A PULL reply's (rows, versions) arrays, views of one buffer (``ReplyBuffers``: reused
        once its last reply has left) that the kernel fills and ZeroMQ sends without a copy;
        None when the table is unknown (the pull names it). Refuses a reply over
        ``--max-message-bytes``."""
        t = self.shard.find(table)
        if t is None:
            return None
        cols = t.width if with_state else t.dim
        nbytes = n * cols * 4
        if nbytes > self.opts.max_message_bytes:
            raise ShardError("limit", f"PULL of {n} rows of table '{table}' would make a "
                                      f"{nbytes}-byte reply, over shard {self.shard.index}'s "
                                      f"limit of {self.opts.max_message_bytes} (pull fewer rows "
                                      "per request, or raise ps serve --max-message-bytes)")
        buf = self.reply_buffers.take(n * 8 + nbytes)  # versions first: 8-byte aligned rows
        return buf[n * 8 :].view(np.float32).reshape(n, cols), buf[: n * 8].view(np.int64)

def _want(arrays: list[np.ndarray], n: int, op: int) -> None:
    if len(arrays) != n:
        raise P.ProtocolError(P.E_BAD_REQUEST, f"{P.OP_NAMES[op]} takes {n} arrays, got {len(arrays)}")


def serve(opts: ServeOptions) -> int:
    """Run a shard until SIGTERM/SIGINT (or its parent exits, with ``parent_pid``)."""
    if opts.parent_pid:  # a thread of its own: within 0.1 s of the parent's death, busy or not
        from cosparse.lifeline import exit_when_orphaned

        exit_when_orphaned(opts.parent_pid, f"PS shard {opts.shard}")
    try:
        server = Server(opts)
    except (ValueError, ConfigError, SnapshotError, OSError, zmq.ZMQError) as e:
        print(f"cosparse ps serve: error: {e}", file=sys.stderr)
        return 2

    def _stop(signum: int, frame: object) -> None:
        server.running = False

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(f"cosparse ps: shard {opts.shard}/{opts.num_shards} serving on {server.endpoint}"
          + (f" (restored {server.restored})" if server.restored else ""), file=sys.stderr, flush=True)
    server.serve_forever()
    return 0
