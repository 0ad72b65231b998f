"""PSClient: the sharded parameter-server client (one ZeroMQ DEALER socket per shard).

``pull`` and ``push`` split a batch of IDs by owning shard (``mix64(id) % N``), send one request to
every shard involved before waiting for any reply (all shards work in parallel, many requests in
flight), and reassemble the replies in the original order with batched numpy indexing. A request
larger than ``CHUNK_ROWS`` rows or about ``CHUNK_BYTES`` bytes goes out as several, all in flight
together; before the first request larger than any shard accepts (``protocol.SMALL_REQUEST_*``)
the client asks each shard for its limits (``ps serve --max-*``, in its PING reply) and splits to
fit them too.

Failure detection never waits forever:

* every wait is a ``zmq.Poller`` slice bounded by the request timeout (``timeout_s``);
* ZeroMQ heartbeats (ZMTP PING/PONG, answered by the peer's I/O thread even while the shard is
  busy) run on a second, idle connection per shard as well as on the data connection: a large
  request that a stopped shard never reads would queue the data connection's PINGs behind it. A
  socket monitor reports every drop at once: a request in flight on a lost connection, or a
  shard whose heartbeat connection is down, raises ``PSUnavailable`` naming the shard index and
  endpoint and how long it has been silent; with ``heartbeat_s: 1`` that is within about 3.5 s
  of the shard's last sign of life, independently of the request timeout;
* an optional ``watch`` callable (``EmbeddedShards.check``) is called on every slice, so a dead
  embedded process is reported by its process watch too.

With an HMAC key, the first request to a shard opens a session (HELLO, see ``protocol``); a
shard that lost it (a new connection, an expired session) answers ``E_SESSION`` without doing
anything, and the client opens a new one and sends the request again.

Every byte sent and received on the sockets (headers included) is counted in ``bytes_pull``
(PULL) and ``bytes_push`` (PUSH, PUSH_ROWS), others in ``bytes_other``.

This module holds the public API (splitting by shard and into chunks, reassembling replies); the
sockets and the health checks are ``connections``, one round of requests is ``call``, the
errors are ``errors``.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zmq

from cosparse.config import TableConfig
from cosparse.link import LinkShaper
from cosparse.ps import protocol as P
from cosparse.ps.call import MAX_SESSION_RETRIES, Call, ClientCounters
from cosparse.ps.connections import ShardConnections
from cosparse.ps.errors import PSAccessDenied, PSAuthError, PSError, PSFull, PSNonFinite, PSUnavailable
from cosparse.ps.keys import read_key_file
from cosparse.ps.namespaces import DEFAULT_NAMESPACE
from cosparse.ps.run_ids import run_doc_array

__all__ = ["CHUNK_BYTES", "CHUNK_ROWS", "MAX_SESSION_RETRIES", "ClientCounters", "PSAccessDenied",
           "PSAuthError", "PSClient", "PSError", "PSFull", "PSNonFinite", "PSUnavailable", "PullResult"]

CHUNK_ROWS = 1 << 18  # rows per request at most (a shard's default limit is 2^20)
CHUNK_BYTES = 64 << 20  # bytes per request (and PULL reply) at most, about
_OVERHEAD = P.MAX_TEXT + 4096  # a message's header, text and MAC, at most


@dataclass
class PullResult:
    """Rows (``[n, dim]`` or ``[n, dim + state]``) and versions in the order of the pulled IDs, and
    each shard's write counter at the time of the pull (the oldest, when it took several requests)."""

    rows: np.ndarray
    versions: np.ndarray
    write_counters: dict[int, int]


class PSClient:
    """Client of ``len(endpoints)`` shards; shard ``i`` listens on ``endpoints[i]``.

    ``namespace``: the PS namespace of bare table names (``store.remote.namespace``), named in the
    HELLO of each HMAC session; ``quota``: ``{rows, bytes}`` per shard that ``register`` declares
    for it (``store.remote.quota``; only a shard without ``--namespaces`` takes it: with one, the
    operator's namespaces file sets the quotas and a client's is refused).
    ``auth_key``: HMAC shared secret (bytes or a key file path): the namespace's key, on a shard
    with ``--namespaces``. ``curve``: (client secret key
    file, server public key file) from ``cosparse ps keygen``. ``watch``: called while waiting;
    may raise ``PSUnavailable`` (e.g. ``EmbeddedShards.check``).
    """

    def __init__(
        self,
        endpoints: list[str],
        timeout_s: float = 30.0,
        heartbeat_s: float = 1.0,
        auth_key: bytes | str | Path | None = None,
        curve: tuple[str | Path, str | Path] | None = None,
        watch: Callable[[], None] | None = None,
        link: LinkShaper | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        quota: dict | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("PSClient needs at least one endpoint")
        self.endpoints = [e if "://" in e else f"tcp://{e}" for e in endpoints]
        self.num_shards = n = len(self.endpoints)
        self.timeout_s = float(timeout_s)
        self.heartbeat_s = float(heartbeat_s)
        if isinstance(auth_key, (str, Path)):
            auth_key = read_key_file(auth_key)
        self.key = auth_key
        self.watch = watch
        self.link = link  # a simulated link every request and reply crosses (None: unshaped)
        self.namespace = namespace  # where a bare table name lives (``cosparse.ps.namespaces``)
        self.quota = quota  # {rows, bytes} of this namespace, declared with its tables
        self.counters = ClientCounters()
        self._lock = threading.RLock()
        self._widths: dict[tuple[str, bool], int] = {}  # last reply width per (table, with_state)
        self._limits: list[tuple[int, int] | None] = [None] * n  # (message bytes, request rows)
        self.conns = ShardConnections(self.endpoints, self.heartbeat_s, curve)
        self.hb_timeout_s = self.conns.hb_timeout_s

    @property
    def sessions(self) -> list[bytes | None]:
        """The HMAC session nonce per shard (None: none open)."""
        return self.conns.sessions

    @property
    def socks(self) -> list[zmq.Socket]:
        """The data connection (DEALER socket) of each shard."""
        return self.conns.socks

    # --- public API -------------------------------------------------------------------------
    def shard_of(self, ids: np.ndarray) -> np.ndarray:
        return P.shard_of(ids, self.num_shards)

    def qualify(self, table: str) -> str:
        """The wire name of ``table``: ``NAMESPACE/TABLE`` (a bare name is in this client's
        namespace; one with a namespace is kept, as ``shared_as`` gives it)."""
        return table if "/" in table else f"{self.namespace}/{table}"

    def register(self, tables: list[TableConfig]) -> None:
        """Declare tables on every shard (a no-op for tables already there with the same config),
        each under its ``remote_name`` in this client's namespace, or in the namespace its
        ``shared_as`` names; with this client's quota."""
        from cosparse.optim import state_width  # (torch and numba: only when tables are declared)

        docs = []
        for t in tables:
            ns, _, name = self.qualify(t.remote_name).rpartition("/")
            t = dataclasses.replace(t, name=name, ps_name="", shared_as="")
            docs.append({**dataclasses.asdict(t), "namespace": ns})
            key = f"{ns}/{name}"  # row widths, so that even a first large pull is split to fit
            self._widths[(key, False)] = t.dim
            self._widths[(key, True)] = t.dim + state_width(t.optimizer.kind, t.dim)
        doc: dict = {"namespace": self.namespace, "tables": docs}
        if self.quota is not None:  # (else the namespace's quota stays as it is)
            doc["quota"] = self.quota
        text = json.dumps(doc)
        self._call_all(lambda: P.Message(P.OP_REGISTER, text=text))

    def pull(self, table: str, ids: np.ndarray, with_state: bool = False, peek: bool = False
             ) -> PullResult:
        """Rows and versions of ``ids`` (any order, duplicates allowed), in that order.

        ``peek``: unknown IDs read their initial value and are not created (version -1)."""
        return self.pull_many([(table, ids)], with_state, peek)[0]

    def pull_many(self, asks: list[tuple[str, np.ndarray]], with_state: bool = False,
                  peek: bool = False) -> list[PullResult]:
        """``pull`` of several (table, ids) in one round trip: every shard gets all of its
        requests at once, and the call waits once for all the replies."""
        flags = (P.FLAG_WITH_STATE if with_state else 0) | (P.FLAG_PEEK if peek else 0)
        reqs: list[tuple[int, P.Message]] = []
        parts = []  # per ask: (table, ids, order, spans, first request)
        for table, ids in asks:
            table = self.qualify(table)
            ids = np.ascontiguousarray(ids, dtype=np.int64)
            order, bounds = self._split(ids)
            spans = self._chunks(bounds, 8 + 4 * (self._widths.get((table, with_state)) or 0))
            parts.append((table, ids, order, spans, len(reqs)))
            reqs += [(i, P.Message(P.OP_PULL, flags=flags, text=table, arrays=[ids[order[lo:hi]]]))
                     for i, lo, hi in spans]
        replies = self._call(reqs) if reqs else []
        return [self._assemble(table, with_state, ids, order, spans, replies[at : at + len(spans)])
                for table, ids, order, spans, at in parts]

    def _assemble(self, table: str, with_state: bool, ids: np.ndarray, order: np.ndarray,
                  spans: list[tuple[int, int, int]], replies: list[P.Message]) -> PullResult:
        """One pull's result from the replies to its ``spans``, in the order of ``ids``."""
        if not replies:
            return PullResult(np.zeros((0, 0), np.float32), np.zeros(0, np.int64), {})
        width = replies[0].arrays[0].shape[1]
        self._widths[(table, with_state)] = width
        rows = np.empty((ids.shape[0], width), dtype=np.float32)
        versions = np.empty(ids.shape[0], dtype=np.int64)
        counters: dict[int, int] = {}
        for (i, lo, hi), r in zip(spans, replies, strict=True):
            if r.arrays[0].shape != (hi - lo, width) or r.arrays[1].shape != (hi - lo,):
                raise PSError(i, self.endpoints[i], P.E_BAD_FRAME, "reply has the wrong shape")
            rows[order[lo:hi]] = r.arrays[0]
            versions[order[lo:hi]] = r.arrays[1]
            counters[i] = min(counters.get(i, int(r.arg)), int(r.arg))
        return PullResult(rows, versions, counters)

    def push(self, table: str, ids: np.ndarray, grads: np.ndarray, step: int) -> dict[int, int]:
        """Apply ``grads`` [n, dim] of unique ``ids`` at 1-based ``step`` on the owning shards;
        returns each involved shard's write counter after the write."""
        return self._write(P.OP_PUSH, table, ids, grads, step)

    def dump(self, table: str) -> tuple[np.ndarray, np.ndarray]:
        """Every row of ``table`` on every shard, with its optimizer state: (ids, rows)."""
        table = self.qualify(table)
        parts = [r.arrays for r in self._call_all(lambda: P.Message(P.OP_DUMP, text=table))]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def push_rows(self, table: str, ids: np.ndarray, rows: np.ndarray) -> dict[int, int]:
        """Overwrite rows with their optimizer state ([n, dim + state]) on the owning shards."""
        return self._write(P.OP_PUSH_ROWS, table, ids, rows, 0)

    def push_rows_many(self, writes: list[tuple[str, np.ndarray, np.ndarray]]
                       ) -> list[dict[int, int]]:
        """``push_rows`` of several (table, ids, rows) in one round trip."""
        return self._write_many(P.OP_PUSH_ROWS, [(t, i, r, 0) for t, i, r in writes])

    def snapshot(self, name: str = "", incremental: bool = False, run_id: str | None = None
                 ) -> dict[int, str]:
        """Every shard snapshots into its data dir (or the sub-directory ``name``); returns the
        snapshot name per shard. ``run_id``: the training run this client's namespace's rows
        belong to, recorded in the snapshot (``cosparse.ps.run_ids``)."""
        flags = P.FLAG_INCREMENTAL if incremental else 0
        arrays = [] if run_id is None else [run_doc_array(self.namespace, run_id)]
        replies = self._call_all(lambda: P.Message(P.OP_SNAPSHOT, flags=flags, text=name,
                                                   arrays=list(arrays)))
        return {i: r.text for i, r in enumerate(replies)}

    def clear(self) -> list[dict]:
        """Every shard drops the tables of this client's namespace (and its run ID); other
        namespaces' tables stay. Returns each shard's ``{namespace, tables, rows}`` dropped."""
        ns = self.namespace
        return [json.loads(r.text) for r in self._call_all(lambda: P.Message(P.OP_CLEAR, text=ns))]

    def stats(self) -> list[dict]:
        """Each shard's STATS: rows, bytes in/out, requests, queue depth, write counter, limits."""
        return [json.loads(r.text) for r in self._call_all(lambda: P.Message(P.OP_STATS))]

    def ping(self, timeout_s: float | None = None) -> list[float]:
        """Round-trip seconds of a PING to every shard (``PSUnavailable`` when one is dead)."""
        t0 = time.perf_counter()
        self._call_all(lambda: P.Message(P.OP_PING), timeout_s)
        return [time.perf_counter() - t0] * self.num_shards

    def close(self) -> None:
        self.conns.close()

    def __enter__(self) -> PSClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals --------------------------------------------------------------------------
    def _split(self, ids: np.ndarray) -> tuple[np.ndarray, dict[int, tuple[int, int]]]:
        owner = self.shard_of(ids)
        order = np.argsort(owner, kind="stable")
        counts = np.bincount(owner, minlength=self.num_shards)
        ends = np.cumsum(counts)
        return order, {i: (int(ends[i] - counts[i]), int(ends[i]))
                       for i in range(self.num_shards) if counts[i]}

    def _chunks(self, bounds: dict[int, tuple[int, int]], row_bytes: int
                ) -> list[tuple[int, int, int]]:
        """(shard, lo, hi) spans of at most ``CHUNK_ROWS`` rows and about ``CHUNK_BYTES`` bytes,
        and within each shard's own limits."""
        row_bytes = max(1, row_bytes)
        big = [i for i, (lo, hi) in bounds.items() if hi - lo > P.SMALL_REQUEST_ROWS
               or (hi - lo) * row_bytes > P.SMALL_REQUEST_BYTES]
        if any(self._limits[i] is None for i in big):
            self._fetch_limits()
        spans = []
        for i, (lo, hi) in bounds.items():
            max_bytes, max_rows = self._limits[i] or (CHUNK_BYTES + _OVERHEAD, CHUNK_ROWS)
            fit = min(CHUNK_BYTES, max_bytes - _OVERHEAD) // row_bytes
            step = max(1, min(CHUNK_ROWS, max_rows, fit))
            spans += [(i, a, min(a + step, hi)) for a in range(lo, hi, step)]
        return spans

    def _fetch_limits(self) -> None:
        for i, r in enumerate(self._call_all(lambda: P.Message(P.OP_PING))):
            doc = json.loads(r.text)
            self._limits[i] = (int(doc.get("max_message_bytes", CHUNK_BYTES + _OVERHEAD)),
                               int(doc.get("max_request_rows", CHUNK_ROWS)))

    def _write(self, op: int, table: str, ids: np.ndarray, values: np.ndarray, step: int
               ) -> dict[int, int]:
        return self._write_many(op, [(table, ids, values, step)])[0]

    def _write_many(self, op: int, writes: list[tuple[str, np.ndarray, np.ndarray, int]]
                    ) -> list[dict[int, int]]:
        """Each write's shard write counters after it, all sent in one call."""
        reqs: list[tuple[int, P.Message]] = []
        ends = []
        for table, ids, values, step in writes:
            table = self.qualify(table)
            ids = np.ascontiguousarray(ids, dtype=np.int64)
            values = np.ascontiguousarray(values, dtype=np.float32)
            order, bounds = self._split(ids)
            width = values.shape[1] if values.ndim == 2 else 1
            reqs += [(i, P.Message(op, arg=int(step), text=table,
                                   arrays=[ids[order[lo:hi]], values[order[lo:hi]]]))
                     for i, lo, hi in self._chunks(bounds, 8 + 4 * width)]
            ends.append(len(reqs))
        replies = self._call(reqs) if reqs else []
        out, start = [], 0
        for end in ends:
            counters: dict[int, int] = {}
            for (i, _), r in zip(reqs[start:end], replies[start:end], strict=True):
                counters[i] = max(counters.get(i, int(r.arg)), int(r.arg))
            out.append(counters)
            start = end
        return out

    def _call_all(self, make: Callable[[], P.Message], timeout_s: float | None = None
                  ) -> list[P.Message]:
        return self._call([(i, make()) for i in range(self.num_shards)], timeout_s)

    def _call(self, reqs: list[tuple[int, P.Message]], timeout_s: float | None = None
              ) -> list[P.Message]:
        """Send every (shard, request), then wait for all replies; returns them in that order."""
        # ZeroMQ sockets are not thread-safe: the planner's prefetch pulls and the trainer's
        # pushes share this client, so requests go out one call at a time
        with self._lock:
            timeout = self.timeout_s if timeout_s is None else timeout_s
            return Call(self.conns, self.key, self.counters, reqs, timeout, self.watch,
                        self.link, self._send, self.namespace).run()

    def _send(self, i: int, frames: list, wait_s: float) -> None:
        """Put one message on shard ``i``'s connection (waiting up to ``wait_s`` for one)."""
        self.conns.send(i, frames, wait_s)
