"""PS namespaces: many models on one set of shards, each with its own tables.

A table on a shard is keyed by (namespace, table), written ``NAMESPACE/TABLE`` on the wire (a
table name never holds a ``/``); a bare ``TABLE`` (an older client, an older snapshot manifest,
``ps serve --config``) is in ``default``. So two models' same-named tables never share rows,
unless one names the other's table on purpose (``tables[i].shared_as``).

``NamespaceBook`` keeps what a shard knows per namespace: its quota (rows and bytes on this shard,
within the shard's row budget: from the operator's ``ps serve --namespaces`` file, or, on a shard
without one, declared by the namespace's REGISTER) and its request accounting
(requests, rows and array bytes per op, and the requests refused).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from cosparse.config.store import DEFAULT_NAMESPACE, PS_NAME_PATTERN
from cosparse.ps import protocol as P
from cosparse.ps.limits import ShardError

__all__ = ["COUNTED_OPS", "DEFAULT_NAMESPACE", "NamespaceBook", "Quota", "account", "key_of",
           "split_key"]

COUNTED_OPS = (P.OP_PULL, P.OP_PUSH, P.OP_PUSH_ROWS, P.OP_DUMP)  # accounted per namespace

_NAME = re.compile(PS_NAME_PATTERN)
QUOTA_KEY = "store.remote.quota"


@functools.lru_cache(maxsize=4096)  # every request names its table: checked once per name
def split_key(text: str) -> tuple[str, str]:
    """(namespace, table) of a wire table name ``NAMESPACE/TABLE`` or ``TABLE`` (``default``)."""
    ns, sep, name = text.rpartition("/")
    ns = ns if sep else DEFAULT_NAMESPACE
    if not _NAME.match(ns) or not _NAME.match(name):
        raise ShardError("request", f"bad table name {text!r}: expected TABLE or NAMESPACE/TABLE "
                                    "(each 1 to 128 letters, digits, '_', '.', '-')")
    return ns, name


def key_of(namespace: str, table: str) -> str:
    """The shard's key of ``table`` in ``namespace``: ``NAMESPACE/TABLE``."""
    return f"{namespace}/{table}"


@dataclass(frozen=True)
class Quota:
    """At most ``rows`` rows and ``bytes`` bytes (rows * width * 4) of a namespace on a shard."""

    rows: int | None = None
    bytes: int | None = None

    @staticmethod
    def from_doc(doc: object, max_rows: int) -> Quota:
        """A quota from a REGISTER document (``{"rows": N, "bytes": N}``), within the row budget."""
        if not isinstance(doc, dict) or set(doc) - {"rows", "bytes"}:
            raise ShardError("request", f"REGISTER: quota must be {{rows, bytes}}, got {doc!r}")
        vals = {}
        for k in ("rows", "bytes"):
            v = doc.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ShardError("request", f"REGISTER: quota.{k} ({QUOTA_KEY}.{k}) must be a "
                                            f"positive integer, got {v!r}")
            vals[k] = v
        if vals["rows"] is not None and vals["rows"] > max_rows:
            raise ShardError("limit", f"a quota of {vals['rows']} rows ({QUOTA_KEY}.rows) is over "
                                      f"the shard's row budget of {max_rows} rows (ps serve "
                                      "--max-rows / store.remote.max_rows): a quota lives inside it")
        return Quota(**vals)

    def room(self, rows: int, nbytes: int, row_bytes: int) -> int | None:
        """New rows of ``row_bytes`` each that fit, holding ``rows`` / ``nbytes`` (None: no bound)."""
        left = []
        if self.rows is not None:
            left.append(self.rows - rows)
        if self.bytes is not None:
            left.append((self.bytes - nbytes) // max(1, row_bytes))
        return max(0, min(left)) if left else None

    def describe(self) -> str:
        parts = ([f"{self.rows} rows"] if self.rows is not None else []) + (
            [f"{self.bytes} bytes"] if self.bytes is not None else [])
        return " and ".join(parts)


class NamespaceBook:
    """Quotas and request accounting per namespace, on one shard."""

    def __init__(self) -> None:
        self.quotas: dict[str, Quota] = {}
        # namespace -> where its quota is set, as a refusal names it
        self.quota_keys: dict[str, str] = {}
        # namespace -> op name -> {requests, rows, bytes, refused}
        self.ops: dict[str, dict[str, dict[str, int]]] = {}

    def set_quota(self, namespace: str, quota: Quota | None, key: str | None = None) -> None:
        """The namespace's quota (None: no quota), from its latest REGISTER or the operator's
        namespaces file; ``key``: where it is set (default ``store.remote.quota``)."""
        if quota is None:
            self.quotas.pop(namespace, None)
            self.quota_keys.pop(namespace, None)
        else:
            self.quotas[namespace] = quota
            self.quota_keys[namespace] = key or f"{QUOTA_KEY} of namespace '{namespace}'"

    def quota_key(self, namespace: str) -> str:
        """Where the namespace's quota is set (what a refusal tells to raise)."""
        return self.quota_keys.get(namespace, f"{QUOTA_KEY} of namespace '{namespace}'")

    def count(self, namespace: str, op: str, rows: int, nbytes: int, ok: bool) -> None:
        """One request of ``op`` on ``namespace``: its IDs and array bytes (in and out)."""
        c = self.ops.setdefault(namespace, {}).setdefault(
            op, {"requests": 0, "rows": 0, "bytes": 0, "refused": 0})
        if ok:
            c["requests"] += 1
            c["rows"] += rows
            c["bytes"] += nbytes
        else:
            c["refused"] += 1

    def stats(self, held: dict[str, tuple[int, int]]) -> dict[str, dict]:
        """Per namespace: rows and bytes held (``held``), its quota, its requests per op."""
        out = {}
        for ns in sorted(set(held) | set(self.quotas) | set(self.ops)):
            rows, nbytes = held.get(ns, (0, 0))
            q = self.quotas.get(ns)
            out[ns] = {"rows": rows, "bytes": nbytes,
                       "quota": None if q is None else {"rows": q.rows, "bytes": q.bytes},
                       "ops": self.ops.get(ns, {})}
        return out


def account(book: NamespaceBook, req: P.Message | None, reply: P.Message) -> None:
    """Count a data request on the namespace of the table it names (refused ones too)."""
    if req is None or req.op not in COUNTED_OPS:
        return
    try:
        ns, _ = split_key(req.text)
    except ShardError:
        return
    ok = reply.error == P.E_OK
    nbytes = sum(a.nbytes for a in req.arrays) + sum(a.nbytes for a in reply.arrays)
    rows = int(req.arrays[0].shape[0]) if req.arrays else \
        int(reply.arrays[0].shape[0]) if reply.arrays else 0
    book.count(ns, P.OP_NAMES[req.op], rows, nbytes, ok)
