"""Where a checkpoint's embedding rows are, read back as (sorted IDs, embeddings) per table:
the trainer's own checkpoint (``table-<name>.npz``: all-resident and tiered tables), a
many-rank checkpoint (DCP, merged with ``load_sharded_rows``), or the PS shards' snapshots the
checkpoint's ``ps`` section names (a full snapshot and the incremental ones over it, per shard).

Only the embedding columns (the first ``dim`` of each row) are kept: the optimizer state beside
them is for training. ``changed`` compares two states of a table (rows whose bytes differ, new
IDs, and IDs gone); ``ps_changed`` reads the rows a PS chain dirtied since a snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cosparse.config import TableConfig
from cosparse.config.convert import from_dict
from cosparse.optim import state_width
from cosparse.ps.namespaces import DEFAULT_NAMESPACE, key_of, split_key
from cosparse.ps.snapshot_format import SnapshotError, read_manifest, read_table_arrays
from cosparse.ps.snapshots import chain
from cosparse.serving.format import ServingError
from cosparse.train.checkpoint import FORMAT_VERSION, CheckpointError


@dataclass
class Rows:
    """One table's embeddings: ``ids`` sorted ascending, ``emb[i]`` (float32 [n, dim]) of ``ids[i]``."""

    ids: np.ndarray
    emb: np.ndarray


def _sorted(ids: np.ndarray, rows: np.ndarray, dim: int) -> Rows:
    order = np.argsort(ids, kind="stable")
    return Rows(np.ascontiguousarray(ids[order], np.int64),
                np.ascontiguousarray(rows[order, :dim], np.float32))


def table_configs(meta: dict[str, Any]) -> dict[str, TableConfig]:
    """The checkpoint's tables, from the config it records."""
    return {t["name"]: from_dict(TableConfig, t, f"tables[{i}]")
            for i, t in enumerate(meta["config"]["tables"])}


def ps_namespace(meta: dict[str, Any]) -> str:
    """The PS namespace the checkpoint's run kept its tables in (``store.remote.namespace``)."""
    remote = meta["config"].get("store", {}).get("remote") or {}
    return remote.get("namespace") or DEFAULT_NAMESPACE


def ps_key(cfg: TableConfig, namespace: str) -> str:
    """The shards' key of a table, ``NAMESPACE/TABLE``, as its snapshots' manifests name it."""
    name = cfg.remote_name
    return key_of(*split_key(name)) if "/" in name else key_of(namespace, name)


def in_checkpoint(meta: dict[str, Any]) -> list[str]:
    """The tables whose rows the checkpoint itself holds (the others are on the PS)."""
    if "sharded" in meta:
        return sorted(meta["sharded"]["tables"])
    return list(meta["tables"])


def checkpoint_rows(ck: Path, meta: dict[str, Any], names: list[str]) -> dict[str, Rows]:
    """The embeddings of ``names`` held in checkpoint directory ``ck`` itself."""
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{ck}: checkpoint format {meta.get('format_version')}, this "
                              f"build reads {FORMAT_VERSION}")
    tables = table_configs(meta)
    if "sharded" in meta:
        from cosparse.train.sharded_checkpoint import load_sharded_rows

        whole = load_sharded_rows(ck, meta, list(tables.values()), names)
        return {n: _sorted(whole[n]["ids"], whole[n]["rows"], tables[n].dim) for n in names}
    out = {}
    for n in names:
        with np.load(ck / f"table-{n}.npz", allow_pickle=False) as z:
            out[n] = _sorted(z["ids"], z["rows"], tables[n].dim)
    return out


def _shard_state(root: Path, name: str, shard: int, tables: dict[str, TableConfig],
                 names: list[str] | None = None) -> dict[str, Rows]:
    """Per PS table, the rows of snapshot ``name`` of one shard: its chain applied, or, with
    ``names`` (snapshots of the chain, newest first), only the rows those hold."""
    snaps = chain(root, name) if names is None else names
    parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for snap in snaps:  # newest first: a row's first copy is its latest
        d = root / "snapshots" / snap
        m = read_manifest(d)
        if m["shard"] != shard:
            raise SnapshotError(f"{d}: snapshot of PS shard {m['shard']}, expected {shard} "
                                "(give the shards' data dirs in shard order)")
        for tname, tm in m["tables"].items():  # NAMESPACE/TABLE; older snapshots: TABLE
            key = key_of(*split_key(tname))
            if key not in tables:
                continue
            cfg = tables[key]
            width = cfg.dim + state_width(cfg.optimizer.kind, cfg.dim)
            ids, rows, _ = read_table_arrays(d, tname, tm, width)
            parts.setdefault(key, []).append((ids, rows[:, : cfg.dim]))
    out = {}
    for tname, ps in parts.items():
        ids = np.concatenate([p[0] for p in ps]).astype(np.int64)
        rows = np.concatenate([p[1] for p in ps])
        _, first = np.unique(ids, return_index=True)
        out[tname] = Rows(ids[first], np.ascontiguousarray(rows[first], np.float32))
    return out


def _by_ps_key(tables: dict[str, TableConfig], names: list[str], namespace: str
               ) -> dict[str, TableConfig]:
    return {ps_key(tables[n], namespace): tables[n] for n in names}


def _gather(per_shard: list[dict[str, Rows]], tables: dict[str, TableConfig], names: list[str],
            namespace: str) -> dict[str, Rows]:
    """The shards' parts of each table (disjoint IDs), as one sorted table."""
    out = {}
    for n in names:
        key = ps_key(tables[n], namespace)
        ps = [s[key] for s in per_shard if key in s]
        if not ps:
            out[n] = Rows(np.zeros(0, np.int64), np.zeros((0, tables[n].dim), np.float32))
            continue
        out[n] = _sorted(np.concatenate([p.ids for p in ps]),
                         np.concatenate([p.emb for p in ps]), tables[n].dim)
    return out


def ps_rows(roots: list[Path], snapshots: list[str], tables: dict[str, TableConfig],
            names: list[str], namespace: str = DEFAULT_NAMESPACE) -> dict[str, Rows]:
    """The embeddings of ``names`` (bare names in ``namespace``) in the PS snapshots
    ``snapshots`` (one per shard root)."""
    by_ps = _by_ps_key(tables, names, namespace)
    return _gather([_shard_state(r, s, i, by_ps) for i, (r, s) in
                    enumerate(zip(roots, snapshots, strict=True))], tables, names, namespace)


def changed(old: Rows, new: Rows) -> tuple[Rows, np.ndarray]:
    """(the rows of ``new`` that ``old`` lacks or holds other bytes for, the IDs of ``old``
    that ``new`` lacks). Bytes, not values: -0.0 against 0.0 or a NaN's payload count."""
    pos = np.searchsorted(old.ids, new.ids)
    safe = np.minimum(pos, max(old.ids.shape[0] - 1, 0))
    if old.ids.shape[0]:
        present = (pos < old.ids.shape[0]) & (old.ids[safe] == new.ids)
        same = present & (old.emb[safe].view(np.uint32) == new.emb.view(np.uint32)).all(axis=1)
    else:
        same = np.zeros(new.ids.shape[0], np.bool_)
    removed = old.ids[~np.isin(old.ids, new.ids, assume_unique=True)]
    return Rows(new.ids[~same], new.emb[~same]), removed


def ps_changed(roots: list[Path], since: list[str], now: list[str],
               tables: dict[str, TableConfig], names: list[str],
               namespace: str = DEFAULT_NAMESPACE) -> tuple[dict[str, Rows], str]:
    """The rows of ``names`` changed on the PS between snapshots ``since`` and ``now`` (one
    per shard), and how they were found: ``ps-incremental`` when on every shard ``since`` is in
    the chain of ``now`` (the incremental snapshots after it hold exactly the rows written or
    created since: a shard marks each one dirty and a snapshot cleans what it wrote; the PS
    never removes a row), else ``diff`` (both states rebuilt and compared)."""
    chains = [chain(r, n) for r, n in zip(roots, now, strict=True)]
    by_ps = _by_ps_key(tables, names, namespace)
    if all(s in c for s, c in zip(since, chains, strict=True)):
        parts = [_shard_state(r, n, i, by_ps, names=c[: c.index(s)])
                 for i, (r, n, s, c) in enumerate(zip(roots, now, since, chains, strict=True))]
        return _gather(parts, tables, names, namespace), "ps-incremental"
    old = ps_rows(roots, since, tables, names, namespace)
    new = ps_rows(roots, now, tables, names, namespace)
    out = {}
    for n in names:
        rows, removed = changed(old[n], new[n])
        if removed.shape[0]:  # never on a PS: its rows are not removed
            raise ServingError(f"PS table '{n}': {removed.shape[0]} rows of the earlier "
                               "snapshot are gone from the later one")
        out[n] = rows
    return out, "diff"


def snapshot_dirs_exist(roots: list[Path], snapshots: list[str]) -> bool:
    """Every shard still holds its snapshot (pruning may have removed it)."""
    return len(roots) == len(snapshots) and all(
        (r / "snapshots" / s).is_dir() for r, s in zip(roots, snapshots, strict=True))
