"""One parameter-server shard's store: its tables, the requests on them, and its snapshots.

A shard owns the IDs with ``mix64(id) % num_shards == index``; its tables are keyed
``NAMESPACE/TABLE`` (``namespaces``: a quota and request accounting per namespace), each a
``ShardTable`` (rows + optimizer state + versions). The shard keeps a write counter (one per
applied write request). Snapshots (``snapshot`` / ``restore``) are written and read by
``snapshot_format``.

Requests from the network are bounded (``ShardLimits``): tables per shard and their width, rows
per request, and a row budget and a byte budget (``row_bytes`` per row) for the whole shard; each
is refused with an error that names the
limit and the option that sets it, before anything is allocated. Non-finite gradients and rows
are refused, naming the table, and so is a PUSH whose result would be NaN or infinite (a row or
its optimizer state overflowing float32): whole, nothing applied, counted in STATS
(``refused_nonfinite_pushes``).
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import numpy as np

from cosparse.config import TableConfig
from cosparse.ps.limits import ShardError, ShardLimits
from cosparse.ps.namespaces import (
    DEFAULT_NAMESPACE,
    NamespaceBook,
    Quota,
    key_of,
    split_key,
)
from cosparse.ps.protocol import shard_of
from cosparse.ps.shard_table import (
    INITIAL_ROWS,
    NonFiniteResult,
    ShardTable,
    check_finite,
    row_bytes,
)
from cosparse.ps.snapshot_format import (
    SnapshotError,
    read_table_arrays,
    seq_of,
    snapshot_chain,
    write_snapshot,
)
from cosparse.ps.table_config import NAME_RE, canonical_config, table_config_from_dict

# (re-exported: where these lived before the shard's parts got modules of their own)
__all__ = ["NAME_RE", "Shard", "ShardError", "ShardLimits", "ShardTable", "SnapshotError",
           "table_config_from_dict"]


class Shard:
    """Shard ``index`` of ``num_shards``: owns the IDs with ``mix64(id) % num_shards == index``."""

    def __init__(self, index: int, num_shards: int, limits: ShardLimits | None = None,
                 threads: int = 1) -> None:
        if not 0 <= index < num_shards:
            raise ValueError(f"shard index {index} is not in [0, {num_shards})")
        self.index = index
        self.num_shards = num_shards
        self.limits = limits if limits is not None else ShardLimits()
        self.tables: dict[str, ShardTable] = {}
        self.write_counter = 0
        self.refused_nonfinite = 0  # pushes refused whole: their result would be NaN or infinite
        self.snapshot_seq = 0
        self.last_snapshot: str | None = None
        self.run_ids: dict[str, str] = {}  # namespace -> the run its rows belong to (``run_ids``)
        self.full_next = False  # a CLEAR dropped tables: an incremental snapshot would bring
        # them back from its parent, so the next one is full
        self.lock = threading.Lock()
        self.book = NamespaceBook()  # quotas and request accounting per namespace
        self.threads = threads  # of each table's PULL/PUSH kernels (``ShardTable.threads``)

    # --- tables -----------------------------------------------------------------------------
    def register(self, cfgs: list[TableConfig], namespace: str | list[str] = DEFAULT_NAMESPACE,
                 requester: str | None = None, quota: Quota | None | bool = False) -> list[str]:
        """Add tables (in ``namespace``, or each in its own when a list); re-registering one with
        the same config is a no-op, a different one fails naming both sides and what differs
        (``requester``: the namespace asking, which differs for a ``shared_as`` table). ``quota``
        (a ``Quota`` or None) replaces the requester's quota; False leaves it. Nothing is applied
        when anything is refused."""
        lim = self.limits
        spaces = namespace if isinstance(namespace, list) else [namespace] * len(cfgs)
        who = requester or (spaces[0] if spaces else DEFAULT_NAMESPACE)
        keys = [key_of(ns, cfg.name) for ns, cfg in zip(spaces, cfgs, strict=True)]
        for key, cfg in zip(keys, cfgs, strict=True):
            old = self.tables.get(key)
            if old is not None and canonical_config(old.cfg) != canonical_config(cfg):
                raise ShardError("request", _mismatch(key, old, cfg, who))
            if cfg.dim > lim.max_dim:
                raise ShardError("limit", f"table '{key}': dim {cfg.dim} is over shard "
                                          f"{self.index}'s limit of {lim.max_dim} (ps serve --max-dim)")
        new = len(set(keys) - set(self.tables))
        self._check_bytes(keys, cfgs)
        if len(self.tables) + new > lim.max_tables:
            raise ShardError("limit", f"shard {self.index} holds {len(self.tables)} tables; {new} "
                                      f"more would pass its limit of {lim.max_tables} "
                                      "(ps serve --max-tables)")
        if quota is not False:
            self.book.set_quota(who, quota if isinstance(quota, Quota) else None)
        for key, ns, cfg in zip(keys, spaces, cfgs, strict=True):
            if key not in self.tables:
                self.tables[key] = ShardTable(cfg, ns, who, threads=self.threads)
        return sorted(self.tables)

    def _check_bytes(self, keys: list[str], cfgs: list[TableConfig]) -> None:
        """Refuse new tables whose reserved rows (``INITIAL_ROWS`` each) would pass the byte
        budget, before anything is allocated."""
        fresh = {k: c for k, c in zip(keys, cfgs, strict=True) if k not in self.tables}
        costs = [row_bytes(c) for c in fresh.values()]
        need = INITIAL_ROWS * sum(costs)
        held = self.bytes_held
        if fresh and held + need > self.limits.max_bytes:
            raise ShardError("full", f"shard {self.index}'s byte budget is full: it holds {held} "
                                     f"of {self.limits.max_bytes} bytes, and registering "
                                     f"{', '.join(repr(k) for k in fresh)} reserves {need} more "
                                     f"({INITIAL_ROWS} rows each, of {'/'.join(map(str, costs))} "
                                     "bytes); nothing was registered (raise ps serve --max-bytes / "
                                     "store.remote.max_bytes, narrow the tables, or add shards)")

    @property
    def bytes_held(self) -> int:
        """Bytes of every table together, as the byte budget counts them (``charged_bytes``)."""
        return sum(t.charged_bytes for t in self.tables.values())

    def table(self, name: str) -> ShardTable:
        """The table a wire name (``NAMESPACE/TABLE``, or ``TABLE`` in ``default``) names."""
        ns, bare = split_key(name)
        t = self.tables.get(key_of(ns, bare))
        if t is None:  # (the tables of that namespace only: never another tenant's names)
            known = [k for k in sorted(self.tables) if k.startswith(f"{ns}/")]
            raise ShardError("table", f"unknown table '{key_of(ns, bare)}' on shard "
                                      f"{self.index} (registered in namespace '{ns}': "
                                      f"{', '.join(known) or 'none'})")
        return t

    def find(self, name: str) -> ShardTable | None:
        """``table``, or None when it is not there (or the name is malformed)."""
        try:
            return self.table(name)
        except ShardError:
            return None

    def held(self) -> dict[str, tuple[int, int]]:
        """(rows, bytes) each namespace holds on this shard."""
        out: dict[str, tuple[int, int]] = {}
        for t in self.tables.values():
            r, b = out.get(t.namespace, (0, 0))
            out[t.namespace] = (r + t.rows, b + t.rows * t.width * 4)
        return out

    @property
    def rows(self) -> int:
        """Rows held in every table together (what the row budget counts)."""
        return sum(t.rows for t in self.tables.values())

    def _budget(self, t: ShardTable) -> int:
        """New rows ``t`` may take within the row budget and the byte budget."""
        room = self.limits.max_bytes - self.bytes_held + t.charged_bytes  # t's bytes, at most
        return min(self.limits.max_rows - self.rows, room // t.row_bytes - t.rows)  # (its slots)

    def _limits(self, t: ShardTable) -> tuple[int, Quota | None, int | None, int, int]:
        """(new rows ``t`` may take: the shard's row and byte budgets within its namespace's
        quota, the quota, its room, the rows and bytes the namespace holds)."""
        budget = self._budget(t)
        quota = self.book.quotas.get(t.namespace)
        rows, nbytes = self.held().get(t.namespace, (0, 0)) if quota is not None else (0, 0)
        room = quota.room(rows, nbytes, t.width * 4) if quota is not None else None
        return (budget if room is None else min(budget, room)), quota, room, rows, nbytes

    def _refused(self, t: ShardTable, e: ShardError,
                 lim: tuple[int, Quota | None, int | None, int, int]) -> ShardError:
        """The error of a request whose new rows do not fit (``e``: the table's own), naming
        the quota or the row budget that refused them."""
        budget, quota, room, rows, nbytes = lim
        if quota is not None and room is not None and room < self._budget(t):
            return ShardError("quota", f"namespace '{t.namespace}' is at its quota on shard "
                                       f"{self.index}: it holds {rows} rows, {nbytes} bytes of "
                                       f"its quota of {quota.describe()}; {e}; nothing was "
                                       f"applied (raise {self.book.quota_key(t.namespace)}, "
                                       "or add shards)")
        if self.limits.max_rows - self.rows > budget:  # the bytes ran out first
            return ShardError("full", f"shard {self.index}'s byte budget is full: it holds "
                                      f"{self.bytes_held} of {self.limits.max_bytes} bytes (table "
                                      f"'{t.label}': {t.row_bytes} bytes a row); {e}; nothing was "
                                      "applied (raise ps serve --max-bytes / "
                                      "store.remote.max_bytes, or add shards)")
        return ShardError("full", f"shard {self.index}'s row budget is full: it holds "
                                  f"{self.rows} of {self.limits.max_rows} rows; {e} (raise ps "
                                  "serve --max-rows / store.remote.max_rows, or add shards)")

    def _slots(self, t: ShardTable, ids: np.ndarray, create: bool = True) -> np.ndarray:
        """``t.slots`` within the row budget and the namespace's quota: a request whose new rows
        do not fit creates none."""
        lim = self._limits(t)
        try:
            return t.slots(ids, create, lim[0])
        except ShardError as e:
            if e.kind != "full":
                raise
            raise self._refused(t, e, lim) from e

    def _check_ids(self, ids: np.ndarray, owners: bool = True) -> np.ndarray:
        """``ids`` as the kernels take them; ``owners``: refuse IDs of other shards here (the
        fused kernels of PULL and PUSH check that themselves)."""
        if ids.dtype != np.int64 or ids.ndim != 1:
            raise ShardError("request", "IDs must be a 1-D int64 array")
        if ids.shape[0] > self.limits.max_request_rows:
            raise ShardError("limit", f"{ids.shape[0]} IDs in one request; shard {self.index} "
                                      f"takes at most {self.limits.max_request_rows} "
                                      "(ps serve --max-request-rows)")
        if owners and self.num_shards > 1:
            foreign = shard_of(ids, self.num_shards) != self.index
            if foreign.any():
                bad = ids[foreign][:3].tolist()
                raise ShardError("owner", f"shard {self.index}/{self.num_shards} does not own "
                                          f"{int(foreign.sum())} of the IDs (e.g. {bad})")
        return np.ascontiguousarray(ids)

    # --- requests ---------------------------------------------------------------------------
    def pull(self, name: str, ids: np.ndarray, with_state: bool = False, peek: bool = False,
             out: tuple[np.ndarray, np.ndarray] | None = None
             ) -> tuple[np.ndarray, np.ndarray, int]:
        """(rows [n, dim] or [n, dim+state], versions [n], write counter); creates unknown rows,
        unless ``peek``: then they read their initial value, version -1, and nothing changes.
        ``out``: the (rows, versions) arrays to fill (e.g. views of a reply buffer)."""
        t = self.table(name)
        ids = self._check_ids(ids, owners=False)
        lim = self._limits(t)
        try:
            rows, versions = t.pull(ids, with_state, peek, lim[0], self.index, self.num_shards,
                                    out)
        except ShardError as e:
            if e.kind != "full":
                raise
            raise self._refused(t, e, lim) from e
        return rows, versions, self.write_counter

    def dump(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Every row of a table with its optimizer state: (ids, rows [n, dim + state])."""
        t = self.table(name)
        return t.ids_by_slot(), t.slab[: t.rows].copy()

    def push(self, name: str, ids: np.ndarray, grads: np.ndarray, step: int) -> int:
        """Apply the optimizer to unique ``ids`` with ``grads`` [n, dim] at 1-based ``step``."""
        t = self.table(name)
        ids = self._check_ids(ids, owners=False)
        if grads.dtype != np.float32 or grads.shape != (ids.shape[0], t.dim):
            raise ShardError("request", f"grads must be float32 [{ids.shape[0]}, {t.dim}], got "
                                        f"{grads.dtype} {list(grads.shape)}")
        if step < 1:
            raise ShardError("request", f"step must be >= 1, got {step}")
        lim = self._limits(t)
        try:
            t.push(ids, np.ascontiguousarray(grads), step, lim[0], self.index, self.num_shards)
        except NonFiniteResult:
            self.refused_nonfinite += 1
            raise
        except ShardError as e:
            if e.kind != "full":
                raise
            raise self._refused(t, e, lim) from e
        self.write_counter += 1
        return self.write_counter

    def push_rows(self, name: str, ids: np.ndarray, rows: np.ndarray) -> int:
        """Overwrite rows and their optimizer state ([n, dim + state]) of unique ``ids``."""
        t = self.table(name)
        ids = self._check_ids(ids)
        if rows.dtype != np.float32 or rows.shape != (ids.shape[0], t.width):
            raise ShardError("request", f"rows must be float32 [{ids.shape[0]}, {t.width}], got "
                                        f"{rows.dtype} {list(rows.shape)}")
        check_finite(t.label, "rows", ids, rows)
        self._check_unique(ids)
        slots = self._slots(t, ids)
        t.write(slots, rows)
        self.write_counter += 1
        return self.write_counter

    @staticmethod
    def _check_unique(ids: np.ndarray) -> None:
        if ids.shape[0] > 1 and np.unique(ids).shape[0] != ids.shape[0]:
            raise ShardError("request", "pushed IDs must be unique (sum their gradients first)")

    def stats(self) -> dict:
        return {
            "shard": self.index, "num_shards": self.num_shards, "write_counter": self.write_counter,
            "tables": {n: {"rows": t.rows, "bytes": t.rows * t.width * 4, "dim": t.dim,
                           "width": t.width, "namespace": t.namespace,
                           "overhead_bytes": t.overhead_bytes(), "slab_bytes": t.slab_bytes(),
                           "charged_bytes": t.charged_bytes, "row_bytes": t.row_bytes}
                       for n, t in self.tables.items()},
            "namespaces": self.book.stats(self.held()),
            "rows": self.rows,
            "bytes_held": self.bytes_held,  # against limits.max_bytes
            "refused_nonfinite_pushes": self.refused_nonfinite,
            "last_snapshot": self.last_snapshot,
            "run_ids": dict(self.run_ids),
            "limits": dataclasses.asdict(self.limits),
            "threads": self.threads,
        }

    def clear(self, namespace: str) -> dict:
        """Drop every table of ``namespace`` and its run ID (CLEAR: ``cosparse train --fresh``);
        other namespaces' tables are untouched. Returns the tables and rows dropped."""
        dropped = sorted(k for k, t in self.tables.items() if t.namespace == namespace)
        rows = sum(self.tables[k].rows for k in dropped)
        for k in dropped:
            del self.tables[k]
        self.run_ids.pop(namespace, None)
        self.full_next = self.full_next or bool(dropped)
        self.write_counter += 1
        return {"namespace": namespace, "tables": dropped, "rows": rows}

    # --- snapshots --------------------------------------------------------------------------
    def snapshot(self, root: str | Path, incremental: bool = False,
                 run: tuple[str, str] | None = None) -> str:
        """Write a snapshot under ``root`` atomically; returns its name (``root/LATEST`` too).
        ``run``: (namespace, run ID) of the trainer asking, recorded with every namespace's."""
        if run is not None:
            self.run_ids[run[0]] = run[1]
        name, seq = write_snapshot(root, self.tables, self.index, self.num_shards,
                                   self.write_counter, self.snapshot_seq,
                                   incremental and not self.full_next, self.run_ids)
        self.full_next = False
        self.snapshot_seq = seq
        self.last_snapshot = name
        return name

    def restore(self, root: str | Path, name: str | None = None) -> str | None:
        """Load the snapshot chain under ``root`` that ends at ``name`` (default: the newest);
        None when there is none."""
        root = Path(root)
        found = snapshot_chain(root, name, self.index, self.num_shards)
        if found is None:
            return None
        latest, chain = found
        for snap, m in reversed(chain):
            d = root / "snapshots" / snap
            for tname, tm in m["tables"].items():  # NAMESPACE/TABLE; older ones: TABLE
                cfg = table_config_from_dict(tm["config"])
                ns, _ = split_key(tname)
                self.register([cfg], ns, requester=tm.get("registered_by", ns))
                t = self.tables[key_of(ns, cfg.name)]
                ids, rows, vers = read_table_arrays(d, tname, tm, t.width)
                slots = self._slots(t, ids.astype(np.int64))  # within the budgets
                t.slab[slots] = rows.astype(np.float32)
                t.versions[slots] = vers
                t.clean(slots)
            self.write_counter = int(m["write_counter"])
        self.snapshot_seq = seq_of(latest)
        self.last_snapshot = latest
        self.run_ids = {str(k): str(v) for k, v in (chain[0][1].get("run_ids") or {}).items()}
        for t in self.tables.values():  # rows created by restore itself are clean
            t.clean()
        return latest


def _mismatch(key: str, old: ShardTable, cfg: TableConfig, requester: str) -> str:
    """Why a table cannot be registered again: both sides, and each setting that differs."""
    a, b = _flat(canonical_config(old.cfg)), _flat(canonical_config(cfg))
    diff = ", ".join(f"{k} {a.get(k)!r} vs {b.get(k)!r}" for k in sorted(set(a) | set(b))
                     if a.get(k) != b.get(k))
    how = "" if requester == old.namespace else f" (as tables[i].shared_as: {key})"
    return (f"table '{key}' is already registered, by namespace '{old.registered_by}', with a "
            f"different configuration than namespace '{requester}' asks for{how}: {diff} "
            "(a table shared between namespaces needs the same dim, initialiser and optimizer)")


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out

