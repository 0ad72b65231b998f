"""Namespaces as the unit of trust on a shard: ``cosparse ps serve --namespaces FILE``.

The file (YAML) names every namespace that may connect, with its own HMAC key file (a path
relative to the file), its quota on each shard, and the namespaces that may read its tables::

    ctr:  {key: keys/ctr.key, quota: {rows: 50000000, bytes: 64GiB}, readers: [rank]}
    rank: {key: keys/rank.key}

A client opens its session with a HELLO that names its namespace (``store.remote.namespace``),
MACed with that namespace's key (``store.remote.auth_key``); every later request of the session
acts as that namespace (``Tenancy.check_*``):

* PULL, PUSH, PUSH_ROWS and DUMP of its own tables. Of another namespace's table (named
  ``NS/TABLE``, as ``tables[i].shared_as`` does) only PULL and DUMP, and only when that namespace
  lists it in ``readers``; such a PULL creates no rows (a peek). Writes are refused.
* REGISTER of tables in its own namespace; a ``shared_as`` table of another namespace only when it
  may read it and the table is there already (a no-op: its config must match). A REGISTER that
  carries a quota is refused: quotas are the operator's, set in the file, never by a client.
* SNAPSHOT: a snapshot of the whole shard (every namespace: what a restart restores) in the data
  dir, which never replaces an earlier one; a named one only in a sub-directory of the
  namespace's own (``NS`` or ``NS.SUFFIX``).
* CLEAR: drops the tables of its own namespace only (``cosparse train --fresh``).
* STATS: the shard's totals (requests, bytes, rows held, limits), but of the tables and
  namespaces only its own and the tables it may read.

Without ``--namespaces`` the shard is one trust domain: any client (with the key, if there is
one) reads and writes every table and sets any namespace's quota.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from cosparse.config import ConfigError, parse_bytes
from cosparse.config.store import PS_NAME_PATTERN
from cosparse.ps import protocol as P
from cosparse.ps.keys import read_key_file
from cosparse.ps.limits import ShardError
from cosparse.ps.namespaces import Quota, split_key

__all__ = ["Tenancy", "Tenant"]

_FIELDS = ("key", "quota", "readers")
_FLAG = "ps serve --namespaces"


@dataclass(frozen=True)
class Tenant:
    """One namespace of the file: its HMAC key, quota and readers."""

    name: str
    key: bytes
    quota: Quota | None
    readers: frozenset[str]


class Tenancy:
    """The namespaces of ``--namespaces FILE`` and what each session's namespace may do."""

    def __init__(self, path: str, tenants: dict[str, Tenant]) -> None:
        self.path = path
        self.tenants = tenants

    @staticmethod
    def load(path: str | Path, max_rows: int) -> Tenancy:
        """Read and check the file; a ``ValueError`` names the file and the key at fault."""
        where = str(path)
        try:
            raw = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as e:
            raise ValueError(f"--namespaces {where}: cannot read it: {e}") from e
        if not isinstance(raw, dict) or not raw:
            raise ValueError(f"--namespaces {where}: expected a mapping NAMESPACE: {{key: FILE, "
                             "quota: {rows, bytes}, readers: [NAMESPACE, ...]}, with at least one")
        tenants = {}
        for name, entry in raw.items():
            if not isinstance(name, str) or not re.match(PS_NAME_PATTERN, name):
                raise ValueError(f"{where}: {name!r} is not a valid namespace name (1 to 128 "
                                 "letters, digits, '_', '.', '-')")
            if not isinstance(entry, dict) or set(entry) - set(_FIELDS) or "key" not in entry:
                got = sorted(entry) if isinstance(entry, dict) else entry
                raise ValueError(f"{where}: {name}: expected {{key: FILE, quota: {{rows, bytes}}, "
                                 f"readers: [...]}} (key required), got {got!r}")
            tenants[name] = Tenant(name, _key(where, name, entry["key"]),
                                   _quota(where, name, entry.get("quota"), max_rows),
                                   _readers(where, name, entry.get("readers"), raw))
        return Tenancy(where, tenants)

    # --- authentication ---------------------------------------------------------------------
    def key(self, namespace: str) -> bytes:
        """The HMAC key of ``namespace``; an ``E_AUTH`` refusal when it is not in the file."""
        t = self.tenants.get(namespace)
        if t is None:
            raise P.ProtocolError(P.E_AUTH, f"namespace {namespace[:128]!r} may not connect: it "
                                            f"is not in this shard's namespaces file ({_FLAG}); "
                                            "set store.remote.namespace to one that is")
        return t.key

    def quota_key(self, namespace: str) -> str:
        """Where ``namespace``'s quota is set, as a quota refusal names it."""
        return f"'{namespace}.quota' in the namespaces file {self.path} ({_FLAG})"

    # --- access -----------------------------------------------------------------------------
    def check_table(self, namespace: str, table: str, write: bool) -> bool:
        """May ``namespace`` read (or ``write``) ``table`` (a wire name)? True when it reads
        another namespace's table (its PULL must create nothing); ``E_DENIED`` when it may not."""
        owner, _ = split_key(table)
        if owner == namespace:
            return False
        key = f"{owner}/{split_key(table)[1]}"
        if write:
            raise ShardError("denied", f"namespace '{namespace}' may not write table '{key}' of "
                                       f"namespace '{owner}': only '{owner}' writes its tables "
                                       f"(its readers in {self.path} may only read them)")
        t = self.tenants.get(owner)
        if t is None or namespace not in t.readers:
            raise ShardError("denied", f"namespace '{namespace}' may not read table '{key}': "
                                       f"namespace '{owner}' does not list it in its readers "
                                       f"('{owner}.readers' in {self.path}, {_FLAG})")
        return True

    def check_register(self, namespace: str, requester: str | None, quota_given: bool,
                       keys: list[str], present: set[str] | dict) -> None:
        """A REGISTER of ``keys`` (``NS/TABLE``) by ``namespace``: as itself, with no quota, and
        another namespace's table only when it may read it and the table is there already."""
        if requester is not None and requester != namespace:
            raise ShardError("denied", f"REGISTER as namespace '{requester}' on a session of "
                                       f"namespace '{namespace}': a session acts only as the "
                                       "namespace whose key opened it")
        if quota_given:
            raise ShardError("denied", f"REGISTER of namespace '{namespace}' carries a quota: on "
                                       f"this shard quotas are set by its operator "
                                       f"({self.quota_key(namespace)}), never by a client "
                                       "(remove store.remote.quota)")
        for key in keys:
            if self.check_table(namespace, key, write=False) and key not in present:
                owner = split_key(key)[0]
                raise ShardError("denied", f"namespace '{namespace}' may not create table '{key}' "
                                           f"of namespace '{owner}' (tables[i].shared_as): it may "
                                           f"only read it, once '{owner}' has registered it")

    def check_snapshot(self, namespace: str, name: str) -> None:
        """A named SNAPSHOT only under a name of the namespace's own: ``NS`` or ``NS.SUFFIX``."""
        if name and name != namespace and not name.startswith(f"{namespace}."):
            raise ShardError("denied", f"SNAPSHOT {name!r}: namespace '{namespace}' may name its "
                                       f"snapshots '{namespace}' or '{namespace}.SUFFIX' only "
                                       "(the shard's own snapshots take no name)")

    def stats_view(self, namespace: str, stats: dict) -> dict:
        """``stats`` as ``namespace`` sees them: the shard's totals, and of the tables and
        namespaces only its own and the tables it may read."""
        def readable(key: str) -> bool:
            owner = split_key(key)[0]
            return owner == namespace or (owner in self.tenants
                                          and namespace in self.tenants[owner].readers)

        out = dict(stats)
        out["tables"] = {k: v for k, v in stats.get("tables", {}).items() if readable(k)}
        out["namespaces"] = {k: v for k, v in stats.get("namespaces", {}).items() if k == namespace}
        out["run_ids"] = {k: v for k, v in stats.get("run_ids", {}).items() if k == namespace}
        return out


def _key(where: str, name: str, path: object) -> bytes:
    if not isinstance(path, str) or not path:
        raise ValueError(f"{where}: {name}.key: expected the path of an HMAC key file, got {path!r}")
    full = Path(path) if Path(path).is_absolute() else Path(where).parent / path
    try:
        return read_key_file(full)
    except (OSError, ValueError) as e:
        raise ValueError(f"{where}: {name}.key: {e}") from e


def _quota(where: str, name: str, doc: object, max_rows: int) -> Quota | None:
    if doc is None:
        return None
    if not isinstance(doc, dict) or not doc or set(doc) - {"rows", "bytes"}:
        raise ValueError(f"{where}: {name}.quota: expected {{rows: N, bytes: N}} (either or both), "
                         f"got {doc!r}")
    vals: dict[str, int | None] = {}
    for k in ("rows", "bytes"):
        v = doc.get(k)
        if k == "bytes" and isinstance(v, str):
            try:
                v = parse_bytes(v, f"{where}: {name}.quota.bytes")
            except ConfigError as e:
                raise ValueError(str(e)) from e
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{where}: {name}.quota.{k}: must be a positive integer, got {v!r}")
        vals[k] = v
    if vals["rows"] is not None and vals["rows"] > max_rows:
        raise ValueError(f"{where}: {name}.quota.rows: {vals['rows']} is over the shard's row "
                         f"budget of {max_rows} rows (ps serve --max-rows): a quota lives inside it")
    return Quota(**vals)


def _readers(where: str, name: str, doc: object, raw: dict) -> frozenset[str]:
    if doc is None:
        return frozenset()
    if not isinstance(doc, list) or not all(isinstance(r, str) for r in doc):
        raise ValueError(f"{where}: {name}.readers: expected a list of namespace names, got {doc!r}")
    for r in doc:
        if r not in raw:
            raise ValueError(f"{where}: {name}.readers: '{r}' is not a namespace of this file "
                             f"(namespaces: {', '.join(sorted(map(str, raw)))})")
    return frozenset(doc)
