"""The HMAC sessions of a shard's connections (see ``protocol``): which key checks a message,
and each connection's session nonce, request counter and namespace.

With one shared key (``--auth-key``) every session uses it; with ``--namespaces`` a HELLO names
its namespace, whose key (``Tenancy.key``) checks it and every later message of the session,
and the session acts as that namespace. Sessions are kept per ZeroMQ routing identity (new for
every connection), the least recently used dropped past ``MAX_SESSIONS`` (that client says
HELLO again).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass

from cosparse.ps import protocol as P
from cosparse.ps.tenancy import Tenancy

MAX_SESSIONS = 4096


@dataclass
class Session:
    """One connection's session: its nonce, last request counter, key and namespace (None on a
    shard without ``--namespaces``: one trust domain)."""

    nonce: bytes
    counter: int
    key: bytes
    namespace: str | None


class Sessions:
    """The sessions of one shard (none when it has neither a key nor a namespaces file)."""

    def __init__(self, key: bytes | None, tenancy: Tenancy | None) -> None:
        self.key, self.tenancy = key, tenancy
        self.by_ident: OrderedDict[bytes, Session] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.key is not None or self.tenancy is not None

    def hello_key(self, body: list) -> tuple[bytes | None, str | None]:
        """(key, namespace) that check a HELLO: the shared key, or the key of the namespace its
        text names (read before its MAC is checked: it picks the key that checks it)."""
        if self.tenancy is None:
            return self.key, None
        try:
            buf = body[1].buffer if hasattr(body[1], "buffer") else memoryview(body[1])
            name = bytes(buf[: P.MAX_TEXT]).decode("utf-8") if len(body) > 1 else ""
        except UnicodeDecodeError as e:
            raise P.ProtocolError(P.E_AUTH, "HELLO: the namespace is not UTF-8") from e
        if not name:
            raise P.ProtocolError(P.E_AUTH, "HELLO names no namespace: this shard has "
                                            "namespaces (ps serve --namespaces); set "
                                            "store.remote.namespace and its key, "
                                            "store.remote.auth_key")
        return self.tenancy.key(name), name

    def lookup(self, ident: bytes, rid: int) -> Session:
        """The session of connection ``ident``; ``E_SESSION`` when there is none."""
        sess = self.by_ident.get(ident)
        if sess is None:
            raise P.ProtocolError(P.E_SESSION, "no session on this connection (a new or expired "
                                               "one): send HELLO first", rid)
        self.by_ident.move_to_end(ident)
        return sess

    @staticmethod
    def advance(sess: Session, request_id: int, rid: int) -> None:
        """A request's counter must grow on its session (a replayed or reordered one does not)."""
        if request_id <= sess.counter:
            raise P.ProtocolError(P.E_AUTH, f"replayed or reordered request: counter "
                                            f"{request_id}, this connection is at "
                                            f"{sess.counter}", rid)
        sess.counter = request_id

    def open(self, ident: bytes, request_id: int, key: bytes, namespace: str | None) -> bytes:
        """A new session of connection ``ident`` (after its HELLO): its fresh nonce."""
        nonce = os.urandom(P.NONCE_BYTES)
        self.by_ident[ident] = Session(nonce, request_id, key, namespace)
        self.by_ident.move_to_end(ident)
        while len(self.by_ident) > MAX_SESSIONS:
            self.by_ident.popitem(last=False)
        return nonce
