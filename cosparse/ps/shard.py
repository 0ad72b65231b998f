"""One parameter-server shard's store: tables of rows + optimizer state, versions and snapshots.

Each table is an unbounded host ``Tier`` (the same numba hash map and slab as the host tier), the
table's ``SparseOptimizer`` and a per-row int64 version, bumped on every write. The shard keeps a
write counter (one per applied write request). Unknown IDs are initialised with
``cosparse.store.resident.initial_rows``, a pure function of (table seed, ID), and inserted.

Pushed gradients go through ``gather_rows`` and ``SparseOptimizer.update`` on the shard's slab,
exactly as the all-resident engine applies them, so results are bit-identical.

Snapshots (``snapshot(root, incremental)``) are directories ``root/snapshots/<seq>-full|incr``
holding ``.npy`` files (IDs, rows with state, versions per table) and a JSON manifest with the
sha256 of every file, written into a temporary directory, fsynced and renamed into place; then
``root/LATEST`` names the newest one (also atomically). An incremental snapshot holds only rows
dirtied since the previous snapshot and names it as its parent; ``restore`` follows the chain.

Requests from the network are bounded (``ShardLimits``): tables per shard and their width, rows
per request, and a row budget for the whole shard; each is refused with an error that names the
limit and the option that sets it, before anything is allocated. Non-finite gradients and rows
are refused, naming the table.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cosparse.config import ConfigError, TableConfig, from_dict
from cosparse.config_bounds import BOUNDS, INT64_MAX, INT64_MIN, numeric_leaves, pattern_of
from cosparse.durable import fsync_dir
from cosparse.optim import SparseOptimizer
from cosparse.owner import owner_tag, sweep
from cosparse.ps.protocol import SMALL_REQUEST_ROWS, shard_of
from cosparse.store import kernels
from cosparse.store.resident import initial_rows
from cosparse.store.tier import Tier

SNAPSHOT_FORMAT = "cosparse-ps-snapshot"
SNAPSHOT_VERSION = 1
NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


class ShardError(ValueError):
    """A request the shard refuses (unknown table, foreign IDs, bad shapes)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # "table" | "owner" | "request" | "limit" | "full"


class SnapshotError(RuntimeError):
    """A snapshot that cannot be written or restored (checksum, format, chain)."""


@dataclass(frozen=True)
class ShardLimits:
    """What one shard accepts from its clients (``cosparse ps serve --max-*``).

    The defaults leave room for the benchmarks (8 tables of 1M rows over 2 shards, batches of
    4096) and bound what one request or one client can make a shard allocate.
    """

    max_rows: int = 1 << 27  # rows of every table together (the row budget)
    max_request_rows: int = 1 << 20  # IDs in one PULL, PUSH or PUSH_ROWS
    max_dim: int = 4096  # a table's embedding width
    max_tables: int = 256

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{f.name} (ps serve --{f.name.replace('_', '-')}): must be a "
                                 f"positive integer, got {v!r}")
        if self.max_request_rows < SMALL_REQUEST_ROWS:  # clients send that many without asking
            raise ValueError(f"max_request_rows (ps serve --max-request-rows): at least "
                             f"{SMALL_REQUEST_ROWS}, got {self.max_request_rows}")


def table_config_from_dict(d: dict) -> TableConfig:
    """A TableConfig from plain JSON/YAML data (validated by the config loader's rules)."""
    cfg = from_dict(TableConfig, d, "table")
    if not cfg.name or not NAME_RE.match(cfg.name):
        raise ConfigError(f"table.name: {cfg.name!r} is not a valid table name")
    if cfg.dim <= 0:
        raise ConfigError("table.dim: must be positive")
    for key, v in numeric_leaves(cfg, "tables[0]"):  # the training config's ranges, over the wire
        bound = BOUNDS.get(pattern_of(key))
        if (isinstance(v, int) and not INT64_MIN <= v <= INT64_MAX) or (
                bound is not None and not bound.allows(v)):
            what = bound.describe() if bound is not None else "a 64-bit integer"
            raise ConfigError(f"table '{cfg.name}': {key.removeprefix('tables[0].')} must be "
                              f"{what}, got {v!r}")
    if cfg.init.kind == "uniform" and cfg.init.low > cfg.init.high:
        raise ConfigError(f"table '{cfg.name}': init.low {cfg.init.low} is above init.high "
                          f"{cfg.init.high}")
    return cfg


def _canonical(cfg: TableConfig) -> dict:
    d = dataclasses.asdict(cfg)
    d.pop("features", None)  # which features use a table does not change its rows
    d.pop("pooling", None)
    d.pop("policy", None)
    d.pop("num_embeddings", None)
    return d


class ShardTable:
    """The rows of one table on this shard."""

    def __init__(self, cfg: TableConfig) -> None:
        self.cfg = cfg
        self.optimizer = SparseOptimizer(cfg.optimizer)
        self.dim = cfg.dim
        self.width = cfg.dim + self.optimizer.state_width(cfg.dim)
        self.tier = Tier(f"ps:{cfg.name}", None, self.width, torch.device("cpu"), policy="lfu",
                         initial_rows=1024)
        self.versions = np.zeros(self.tier.capacity, dtype=np.int64)

    @property
    def rows(self) -> int:
        return self.tier.size

    def _fit_versions(self) -> None:
        cap = self.tier.capacity
        if self.versions.shape[0] < cap:
            v = np.zeros(cap, dtype=np.int64)
            v[: self.versions.shape[0]] = self.versions
            self.versions = v

    def slots(self, ids: np.ndarray, create: bool = True, budget: int | None = None) -> np.ndarray:
        """Slots of ``ids``; absent IDs get fresh rows from (table seed, ID) when ``create``.

        ``budget``: at most this many new rows (else ``ShardError('full')``, nothing created)."""
        slots = self.tier.lookup(ids)
        missing = slots < 0
        if create and missing.any():
            new_ids = np.unique(ids[missing])  # duplicates of one new ID share one row
            if budget is not None and new_ids.shape[0] > budget:
                raise ShardError("full", f"table '{self.cfg.name}': {new_ids.shape[0]} new rows "
                                         f"do not fit the {max(budget, 0)} rows left")
            new_slots = self.tier.alloc(new_ids.shape[0])
            self._fit_versions()
            initial_rows(self.cfg, self.width, new_ids, out=self.tier.slab_np, slots=new_slots)
            zeros = np.zeros(new_ids.shape[0], dtype=np.float32)
            self.tier.put(new_ids, new_slots, None, zeros, zeros.astype(np.int64), True)
            self.versions[new_slots] = 0
            slots = self.tier.lookup(ids)
        return slots

    def read(self, slots: np.ndarray, with_state: bool) -> np.ndarray:
        rows = self.tier.read(slots)
        return rows if with_state else np.ascontiguousarray(rows[:, : self.dim])

    def apply(self, slots: np.ndarray, grads: np.ndarray, step: int) -> None:
        """The trainer's update: gather (w, s) from the slab, then the optimizer kernel."""
        u = slots.shape[0]
        w = np.empty((u, self.dim), dtype=np.float32)
        s = np.empty((u, self.width - self.dim), dtype=np.float32)
        kernels.gather_rows(self.tier.slab_np, slots, self.dim, w, s)
        self.optimizer.update(w, s, grads, step, self.tier.slab_np, slots)
        self._touched(slots)

    def write(self, slots: np.ndarray, rows: np.ndarray) -> None:
        self.tier.write(slots, rows)
        self._touched(slots)

    def _touched(self, slots: np.ndarray) -> None:
        self.versions[slots] += 1
        self.tier.dirty[slots] = True


class Shard:
    """Shard ``index`` of ``num_shards``: owns the IDs with ``mix64(id) % num_shards == index``."""

    def __init__(self, index: int, num_shards: int, limits: ShardLimits | None = None) -> None:
        if not 0 <= index < num_shards:
            raise ValueError(f"shard index {index} is not in [0, {num_shards})")
        self.index = index
        self.num_shards = num_shards
        self.limits = limits if limits is not None else ShardLimits()
        self.tables: dict[str, ShardTable] = {}
        self.write_counter = 0
        self.snapshot_seq = 0
        self.last_snapshot: str | None = None
        self.lock = threading.Lock()

    # --- tables -----------------------------------------------------------------------------
    def register(self, cfgs: list[TableConfig]) -> list[str]:
        """Add tables; re-registering one with the same config is a no-op, a different one fails."""
        lim = self.limits
        for cfg in cfgs:
            old = self.tables.get(cfg.name)
            if old is not None and _canonical(old.cfg) != _canonical(cfg):
                raise ShardError("request", f"table '{cfg.name}' is already registered with a "
                                            "different configuration")
            if cfg.dim > lim.max_dim:
                raise ShardError("limit", f"table '{cfg.name}': dim {cfg.dim} is over shard "
                                          f"{self.index}'s limit of {lim.max_dim} (ps serve --max-dim)")
        new = len({c.name for c in cfgs} - set(self.tables))
        if len(self.tables) + new > lim.max_tables:
            raise ShardError("limit", f"shard {self.index} holds {len(self.tables)} tables; {new} "
                                      f"more would pass its limit of {lim.max_tables} "
                                      "(ps serve --max-tables)")
        for cfg in cfgs:
            if cfg.name not in self.tables:
                self.tables[cfg.name] = ShardTable(cfg)
        return sorted(self.tables)

    def table(self, name: str) -> ShardTable:
        t = self.tables.get(name)
        if t is None:
            raise ShardError("table", f"unknown table '{name}' on shard {self.index} "
                                      f"(registered: {', '.join(sorted(self.tables)) or 'none'})")
        return t

    @property
    def rows(self) -> int:
        """Rows held in every table together (what the row budget counts)."""
        return sum(t.rows for t in self.tables.values())

    def _budget(self) -> int:
        return self.limits.max_rows - self.rows

    def _slots(self, t: ShardTable, ids: np.ndarray, create: bool = True) -> np.ndarray:
        """``t.slots`` within the row budget: a request whose new rows do not fit creates none."""
        try:
            return t.slots(ids, create, self._budget())
        except ShardError as e:
            if e.kind != "full":
                raise
            raise ShardError("full", f"shard {self.index}'s row budget is full: it holds "
                                     f"{self.rows} of {self.limits.max_rows} rows; {e} (raise ps "
                                     "serve --max-rows / store.remote.max_rows, or add shards)") from e

    def _check_ids(self, ids: np.ndarray) -> np.ndarray:
        if ids.dtype != np.int64 or ids.ndim != 1:
            raise ShardError("request", "IDs must be a 1-D int64 array")
        if ids.shape[0] > self.limits.max_request_rows:
            raise ShardError("limit", f"{ids.shape[0]} IDs in one request; shard {self.index} "
                                      f"takes at most {self.limits.max_request_rows} "
                                      "(ps serve --max-request-rows)")
        if self.num_shards > 1:
            foreign = shard_of(ids, self.num_shards) != self.index
            if foreign.any():
                bad = ids[foreign][:3].tolist()
                raise ShardError("owner", f"shard {self.index}/{self.num_shards} does not own "
                                          f"{int(foreign.sum())} of the IDs (e.g. {bad})")
        return ids

    # --- requests ---------------------------------------------------------------------------
    def pull(self, name: str, ids: np.ndarray, with_state: bool = False, peek: bool = False
             ) -> tuple[np.ndarray, np.ndarray, int]:
        """(rows [n, dim] or [n, dim+state], versions [n], write counter); creates unknown rows,
        unless ``peek``: then they read their initial value, version -1, and nothing changes."""
        t = self.table(name)
        ids = self._check_ids(ids)
        slots = self._slots(t, ids, create=not peek)
        found = slots >= 0
        if found.all():
            return t.read(slots, with_state), t.versions[slots], self.write_counter
        rows = np.empty((ids.shape[0], t.width if with_state else t.dim), dtype=np.float32)
        versions = np.full(ids.shape[0], -1, dtype=np.int64)
        rows[found] = t.read(slots[found], with_state)
        versions[found] = t.versions[slots[found]]
        fresh = initial_rows(t.cfg, t.width, ids[~found])
        rows[~found] = fresh if with_state else fresh[:, : t.dim]
        return rows, versions, self.write_counter

    def dump(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Every row of a table with its optimizer state: (ids, rows [n, dim + state])."""
        t = self.table(name)
        slots = t.tier.occupied_slots()
        return t.tier.slot_ids[slots], t.tier.read(slots)

    def push(self, name: str, ids: np.ndarray, grads: np.ndarray, step: int) -> int:
        """Apply the optimizer to unique ``ids`` with ``grads`` [n, dim] at 1-based ``step``."""
        t = self.table(name)
        ids = self._check_ids(ids)
        if grads.dtype != np.float32 or grads.shape != (ids.shape[0], t.dim):
            raise ShardError("request", f"grads must be float32 [{ids.shape[0]}, {t.dim}], got "
                                        f"{grads.dtype} {list(grads.shape)}")
        if step < 1:
            raise ShardError("request", f"step must be >= 1, got {step}")
        _check_finite(name, "gradients", ids, grads)
        self._check_unique(ids)
        slots = self._slots(t, ids)
        t.apply(slots, grads, step)
        self.write_counter += 1
        return self.write_counter

    def push_rows(self, name: str, ids: np.ndarray, rows: np.ndarray) -> int:
        """Overwrite rows and their optimizer state ([n, dim + state]) of unique ``ids``."""
        t = self.table(name)
        ids = self._check_ids(ids)
        if rows.dtype != np.float32 or rows.shape != (ids.shape[0], t.width):
            raise ShardError("request", f"rows must be float32 [{ids.shape[0]}, {t.width}], got "
                                        f"{rows.dtype} {list(rows.shape)}")
        _check_finite(name, "rows", ids, rows)
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
                           "width": t.width} for n, t in self.tables.items()},
            "rows": self.rows,
            "last_snapshot": self.last_snapshot,
            "limits": dataclasses.asdict(self.limits),
        }

    # --- snapshots --------------------------------------------------------------------------
    def snapshot(self, root: str | Path, incremental: bool = False) -> str:
        """Write a snapshot under ``root`` atomically; returns its name (``root/LATEST`` too)."""
        root = Path(root)
        snaps = root / "snapshots"
        snaps.mkdir(parents=True, exist_ok=True)
        parent = _read_latest(root)
        incremental = incremental and parent is not None
        seq = max(self.snapshot_seq, _seq_of(parent) if parent else 0) + 1
        name = f"{seq:08d}-{'incr' if incremental else 'full'}"
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-{owner_tag()}-", dir=snaps))
        written: list[tuple[ShardTable, np.ndarray]] = []
        try:
            manifest = {"format": SNAPSHOT_FORMAT, "version": SNAPSHOT_VERSION,
                        "kind": "incremental" if incremental else "full",
                        "parent": parent if incremental else None, "seq": seq,
                        "shard": self.index, "num_shards": self.num_shards,
                        "write_counter": self.write_counter, "tables": {}}
            for i, (tname, t) in enumerate(sorted(self.tables.items())):
                occ = t.tier.occupied_slots()
                slots = occ[t.tier.dirty[occ]] if incremental else occ
                files = {}
                for suffix, arr in (("ids", t.tier.slot_ids[slots]), ("rows", t.tier.read(slots)),
                                    ("versions", t.versions[slots])):
                    fname = f"t{i}.{suffix}.npy"
                    files[fname] = _write_npy(tmp / fname, arr)
                manifest["tables"][tname] = {"config": dataclasses.asdict(t.cfg),
                                             "rows": int(slots.shape[0]), "files": files}
                written.append((t, slots))
            data = json.dumps(manifest, indent=1, sort_keys=True).encode()
            _write_bytes(tmp / "manifest.json", data)
            fsync_dir(tmp)
            os.rename(tmp, snaps / name)
            fsync_dir(snaps)
            _write_bytes(root / ".LATEST.tmp", name.encode())
            os.replace(root / ".LATEST.tmp", root / "LATEST")
            fsync_dir(root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        for t, slots in written:
            t.tier.dirty[slots] = False
        self.snapshot_seq = seq
        self.last_snapshot = name
        return name

    def restore(self, root: str | Path, name: str | None = None) -> str | None:
        """Load the snapshot chain under ``root`` that ends at ``name`` (default: the newest);
        None when there is none."""
        root = Path(root)
        sweep(root / "snapshots", [".tmp-"])  # what a shard killed mid-snapshot left
        latest = _read_latest(root) if name is None else name
        if latest is None:
            return None
        if name is not None and not (root / "snapshots" / name).is_dir():
            raise SnapshotError(f"{root}: no snapshot named {name!r}")
        chain = []
        name: str | None = latest
        while name is not None:
            if not NAME_RE.match(name):
                raise SnapshotError(f"bad snapshot name {name!r} in chain")
            m = _read_manifest(root / "snapshots" / name)
            if (m["shard"], m["num_shards"]) != (self.index, self.num_shards):
                raise SnapshotError(f"snapshot {name} belongs to shard {m['shard']}/"
                                    f"{m['num_shards']}, not {self.index}/{self.num_shards}")
            chain.append((name, m))
            name = m["parent"] if m["kind"] == "incremental" else None
        for name, m in reversed(chain):
            d = root / "snapshots" / name
            for tname, tm in m["tables"].items():
                cfg = table_config_from_dict(tm["config"])
                self.register([cfg])
                t = self.tables[tname]
                arrs = {}
                for fname, digest in tm["files"].items():
                    if not NAME_RE.match(fname):
                        raise SnapshotError(f"{d}: bad file name {fname!r}")
                    raw = (d / fname).read_bytes()
                    if hashlib.sha256(raw).hexdigest() != digest:
                        raise SnapshotError(f"{d / fname}: checksum mismatch")
                    arrs[fname.split(".")[1]] = np.load(d / fname, allow_pickle=False)
                ids, rows, vers = arrs["ids"], arrs["rows"], arrs["versions"]
                if rows.shape != (ids.shape[0], t.width) or vers.shape != ids.shape:
                    raise SnapshotError(f"{d}: table '{tname}' arrays have inconsistent shapes")
                slots = t.slots(ids.astype(np.int64))
                t.tier.write(slots, rows.astype(np.float32))
                t.versions[slots] = vers
                t.tier.dirty[slots] = False
            self.write_counter = int(m["write_counter"])
        self.snapshot_seq = _seq_of(latest)
        self.last_snapshot = latest
        for t in self.tables.values():  # rows created by restore itself are clean
            t.tier.dirty[:] = False
        return latest


def _check_finite(table: str, what: str, ids: np.ndarray, values: np.ndarray) -> None:
    """Refuse NaN or infinite values: one would poison a row for good."""
    ok = np.isfinite(values).all(axis=1)
    if not ok.all():
        bad = np.flatnonzero(~ok)
        raise ShardError("request", f"table '{table}': refused {what} with NaN or infinite values "
                                    f"in {bad.shape[0]} of {ids.shape[0]} rows (e.g. ID "
                                    f"{int(ids[bad[0]])}); nothing was applied")


def _seq_of(name: str) -> int:
    return int(name.split("-")[0])


def _read_latest(root: Path) -> str | None:
    p = root / "LATEST"
    if not p.exists():
        return None
    name = p.read_text().strip()
    if not NAME_RE.match(name) or not (root / "snapshots" / name).is_dir():
        raise SnapshotError(f"{p}: names a missing or invalid snapshot {name!r}")
    return name


def _read_manifest(d: Path) -> dict:
    try:
        m = json.loads((d / "manifest.json").read_text())
    except (OSError, ValueError) as e:
        raise SnapshotError(f"{d}: unreadable manifest ({e})") from e
    if m.get("format") != SNAPSHOT_FORMAT or m.get("version") != SNAPSHOT_VERSION:
        raise SnapshotError(f"{d}: unsupported snapshot format {m.get('format')!r} "
                            f"version {m.get('version')!r}")
    return m


def _write_bytes(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _write_npy(path: Path, arr: np.ndarray) -> str:
    with open(path, "wb") as f:
        np.save(f, np.ascontiguousarray(arr), allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    return hashlib.sha256(path.read_bytes()).hexdigest()


