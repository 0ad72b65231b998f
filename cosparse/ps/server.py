"""The parameter-server shard process: a ROUTER-side ZeroMQ (ZMTP) endpoint in front of a ``Shard``.

``cosparse ps serve --shard I --num-shards N --bind ADDR:PORT --data-dir DIR`` runs ``serve``.
Requests are handled one at a time, in arrival order; the messages already waiting when a batch
is drained are the queue depth reported by STATS, with the serving thread's CPU seconds per op
(``cpu_s_by_op``: decode, the shard's work, encode and send of each request). Any malformed or
refused request gets an error reply (never a crash). The server binds 127.0.0.1 by default; a
non-loopback bind needs authentication (an HMAC shared secret, ``--auth-key FILE``, or CURVE,
``--curve-secret FILE``, or per-namespace HMAC keys, ``--namespaces FILE``: see ``tenancy``).
On start it restores the newest snapshot chain in ``--data-dir``; SNAPSHOT requests write there
(naming the trainer's run, ``run_ids``); CLEAR drops one namespace's tables.

Transport (bounds: see ``transport``): plain and ``--auth-key`` shards speak ZMTP themselves
(``transport``: libzmq cannot bound an incomplete multipart message, and these modes authenticate
a message only once it has arrived); ``--curve-secret`` keeps libzmq's ROUTER (CURVE authenticates
a client before it accepts any frame, so nothing is held before authentication).
Limits: a message over ``--max-message-bytes`` is refused (past twice that, or a single frame over
it, its connection is dropped); rows per request, table shapes and the shard's row and byte
budgets are ``ShardLimits``. With an HMAC key (or namespaces), every connection opens a session
(HELLO) and each request's counter must grow: see ``protocol`` and ``sessions``. Every error reply
of a request whose session is known is MACed under it. Without ``--namespaces`` the shard is one
trust domain.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zmq  # (its errors: the CURVE transport's)

from cosparse.config import ConfigError
from cosparse.ps import protocol as P
from cosparse.ps.keys import keygen, read_key_file
from cosparse.ps.limits import ShardError, ShardLimits
from cosparse.ps.namespaces import COUNTED_OPS, DEFAULT_NAMESPACE, account
from cosparse.ps.register_request import parse_register
from cosparse.ps.reply_buffers import ReplyBuffers
from cosparse.ps.run_ids import clear_namespace_of, parse_run_doc
from cosparse.ps.sessions import Sessions
from cosparse.ps.shard import Shard
from cosparse.ps.snapshot_format import SnapshotError
from cosparse.ps.table_config import NAME_RE, tables_from_yaml
from cosparse.ps.tenancy import Tenancy
from cosparse.ps.transport import TransportLimits, ZmtpTransport, split_bind
from cosparse.ps.warm_up import ensure_warm

# (re-exported for ``cosparse ps serve`` / ``ps keygen``: they lived here before ``keys``)
__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "ServeOptions", "Server", "keygen", "read_key_file",
           "serve", "split_bind", "tables_from_yaml"]

LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
DEFAULT_MAX_MESSAGE_BYTES = 256 << 20
MAX_ERROR_TEXT = 2000
_ERROR_CODES = {"table": P.E_UNKNOWN_TABLE, "owner": P.E_NOT_OWNER, "limit": P.E_LIMIT,
                "full": P.E_FULL, "quota": P.E_QUOTA, "denied": P.E_DENIED,
                "nonfinite": P.E_NONFINITE}
_WRITE_OPS = (P.OP_PUSH, P.OP_PUSH_ROWS)


@dataclass
class ServeOptions:
    shard: int
    num_shards: int
    bind: str = "127.0.0.1:0"
    data_dir: str = "ps-data"
    config: str | None = None
    auth_key: bytes | None = None
    curve_secret: str | None = None
    namespaces: str | None = None  # YAML: each namespace's HMAC key, quota, readers (``tenancy``)
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




class Server:
    """The request loop of one shard."""

    def __init__(self, opts: ServeOptions) -> None:
        host, port = split_bind(opts.bind)
        if host not in LOOPBACK and opts.auth_key is None and opts.curve_secret is None \
                and opts.namespaces is None:
            raise ValueError(f"--bind {opts.bind}: a non-loopback bind requires authentication "
                             "(--auth-key FILE, --namespaces FILE or --curve-secret FILE)")
        if opts.namespaces is not None and opts.auth_key is not None:
            raise ValueError("--auth-key and --namespaces: give one (with --namespaces each "
                             "namespace has its own key, in that file)")
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
        self.tenancy = None if opts.namespaces is None else Tenancy.load(opts.namespaces,
                                                                          opts.limits.max_rows)
        if self.tenancy is not None:  # quotas are the operator's, from the file only
            for t in self.tenancy.tenants.values():
                self.shard.book.set_quota(t.name, t.quota, self.tenancy.quota_key(t.name))
        self.sessions = Sessions(opts.auth_key, self.tenancy)  # per connection (routing identity)
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
        ensure_warm(self.shard.threads)  # (a cold kernel cache compiles now, not on a request)
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
        reply_key: bytes | None = None  # ... with this key
        req: P.Message | None = None
        try:
            sess = None  # known first, so that every error reply of its requests is MACed
            if self.sessions.enabled and op != P.OP_HELLO:  # HELLO replies: MACed under its nonce
                sess = self.sessions.lookup(ident, rid)
                reply_session, reply_key = sess.nonce, sess.key
            if nbytes - len(ident) > self.opts.max_message_bytes:
                raise P.ProtocolError(P.E_LIMIT, f"message of {nbytes - len(ident)} bytes is over "
                                                 f"shard {self.shard.index}'s limit of "
                                                 f"{self.opts.max_message_bytes} (ps serve "
                                                 "--max-message-bytes)", rid)
            key, hello_ns = (self.sessions.hello_key(body) if op == P.OP_HELLO
                             else (sess.key if sess else None, None))
            req = P.decode(body, key, sess.nonce if sess else b"")
            if req.flags & P.FLAG_REPLY:
                raise P.ProtocolError(P.E_BAD_FRAME, "a reply sent as a request", rid)
            if sess is not None:
                self.sessions.advance(sess, req.request_id, rid)
            if op == P.OP_HELLO:
                reply, reply_session = self._hello(req, ident, key, hello_ns)
                reply_key = key
            else:
                reply = self._dispatch(req, sess.namespace if sess else None)
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
        account(self.shard.book, req, reply)
        key = reply_key if reply_session is not None else None
        out = P.encode(reply, key, reply_session or b"")
        self.stats["bytes_out"] += P.frames_nbytes(out)
        self.transport.send(ident, out)
        return op

    def _hello(self, req: P.Message, ident: bytes, key: bytes | None, namespace: str | None
               ) -> tuple[P.Message, bytes | None]:
        """Open this connection's session (of ``namespace`` with ``--namespaces``): a fresh
        nonce, MACed under the client's nonce."""
        _want(req.arrays, 1, P.OP_HELLO)
        nonce = req.arrays[0]
        if nonce.dtype != np.uint8 or nonce.shape != (P.NONCE_BYTES,):
            raise P.ProtocolError(P.E_BAD_REQUEST, f"HELLO takes a {P.NONCE_BYTES}-byte uint8 nonce")
        rep = P.Message(P.OP_HELLO, request_id=req.request_id, flags=P.FLAG_REPLY,
                        arg=self.shard.index)
        if key is None:  # no HMAC: nothing to open (a client with a key refuses this reply)
            return rep, None
        session = self.sessions.open(ident, req.request_id, key, namespace)
        rep.arrays = [np.frombuffer(session, dtype=np.uint8)]
        return rep, nonce.tobytes()

    def _error(self, code: int, text: str, rid: int, op: int) -> P.Message:
        self.stats["errors"] += 1
        if len(text) > MAX_ERROR_TEXT:
            text = text[:MAX_ERROR_TEXT] + "..."
        return P.Message(op=op, request_id=rid, flags=P.FLAG_REPLY, error=code, text=text)

    def _dispatch(self, req: P.Message, ns: str | None = None) -> P.Message:
        """Answer a request of namespace ``ns`` (its session's, with ``--namespaces``; None: the
        shard is one trust domain)."""
        op, a = req.op, req.arrays
        rep = P.Message(op=op, request_id=req.request_id, flags=P.FLAG_REPLY)
        sh = self.shard
        foreign = False  # a read of another namespace's table (it may read it): creates nothing
        if ns is not None and op in COUNTED_OPS:
            foreign = self.tenancy.check_table(ns, req.text, write=op in _WRITE_OPS)
        if op == P.OP_PING:
            rep.arg = sh.index
            rep.text = json.dumps({"shard": sh.index, "num_shards": sh.num_shards, "pid": os.getpid(),
                                   "max_message_bytes": self.opts.max_message_bytes,
                                   "max_request_rows": sh.limits.max_request_rows})
        elif op == P.OP_REGISTER:
            rep.text = json.dumps(self._register(req.text, ns))
        elif op == P.OP_PULL:
            _want(a, 1, op)
            with_state = bool(req.flags & P.FLAG_WITH_STATE)
            out = self._reply_buffers(req.text, a[0].shape[0], with_state)
            rows, versions, wc = sh.pull(req.text, a[0], with_state,
                                         peek=bool(req.flags & P.FLAG_PEEK) or foreign, out=out)
            rep.arrays, rep.arg = [rows, versions], wc
            rep.flags |= req.flags & P.FLAG_WITH_STATE
        elif op == P.OP_PUSH:
            _want(a, 2, op)
            rep.arg = sh.push(req.text, a[0], a[1], int(req.arg))
        elif op == P.OP_PUSH_ROWS:
            _want(a, 2, op)
            rep.arg = sh.push_rows(req.text, a[0], a[1])
        elif op == P.OP_SNAPSHOT:
            run = parse_run_doc(a, ns)  # (namespace, run ID) of the trainer asking, or None
            root = self.data_dir
            if ns is not None:
                self.tenancy.check_snapshot(ns, req.text)
            if req.text:  # a named sub-directory of the data dir, never an arbitrary path
                if not NAME_RE.match(req.text) or req.text in (".", ".."):
                    raise ShardError("request", f"SNAPSHOT: bad name {req.text!r}")
                root = self.data_dir / req.text
            rep.text = sh.snapshot(root, bool(req.flags & P.FLAG_INCREMENTAL), run)
            rep.arg = sh.write_counter
        elif op == P.OP_CLEAR:
            _want(a, 0, op)
            rep.text = json.dumps(sh.clear(clear_namespace_of(req.text, ns)))
            rep.arg = sh.write_counter
        elif op == P.OP_DUMP:
            _want(a, 0, op)
            ids, rows = sh.dump(req.text)
            rep.arrays, rep.arg = [ids, rows], sh.write_counter
        elif op == P.OP_STATS:
            st = sh.stats()
            st.update(self.stats, endpoint=self.endpoint, pid=os.getpid())
            rep.text = json.dumps(st if ns is None else self.tenancy.stats_view(ns, st))
        return rep


    def _register(self, text: str, ns: str | None) -> list[str]:
        """REGISTER (``register_request``): with ``--namespaces``, as the session's namespace
        ``ns`` and only as far as it may (``Tenancy.check_register``); without, as it asks."""
        r = parse_register(text, self.shard.limits.max_rows, ns or DEFAULT_NAMESPACE)
        if ns is not None:
            self.tenancy.check_register(ns, r.requester, r.quota is not False, r.keys,
                                        self.shard.tables)
            return self.shard.register(r.cfgs, r.spaces, ns)
        return self.shard.register(r.cfgs, r.spaces, r.requester, r.quota)

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
