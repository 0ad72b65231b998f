"""``cosparse export``: a checkpoint's embedding rows, without optimizer state, for serving,
and its dense model beside them (``cosparse.serving.dense``: the manifest's ``dense`` entry).

A full export holds every row of every table at the checkpoint's step. With ``since=STEP`` it is
a delta: the rows that changed between STEP and the checkpoint's step (and, for tables the
trainer holds, the IDs dropped meanwhile, e.g. by ``store.ttl_steps``), which ``load`` applies
on the export at STEP. How the changed rows are found, exactly, per where a table's rows are:

* on the PS (the checkpoint names PS snapshots): from the shards' incremental snapshots after
  the snapshot taken at STEP, when that one is in the chain of the current one on every shard
  (every row a shard writes or creates is marked dirty and a snapshot holds exactly the dirty
  rows), else by rebuilding both snapshot states and comparing them (method ``diff``: a full
  snapshot came between). The snapshots of the newest ``store.remote.snapshot_keep`` saves are
  kept (the checkpoint's ``ps.history`` names them), so STEP may be older than the kept
  checkpoints;
* in the trainer's checkpoint (all-resident and tiered tables, one process or many ranks): by
  comparing the rows with those of the kept checkpoint at STEP, bytewise, plus new and removed
  IDs. The tiers' dirty bits are not used: they mark rows not yet written to the tier below,
  are cleared by every flush, and are not recorded in checkpoints, so they do not say what
  changed since a given step; the comparison is exact (only embedding bytes are compared: rows
  whose optimizer state alone changed serve the same).

STEP must be a step a save was taken at that is still kept (the checkpoints under the same root,
``train.checkpoint.keep``, and for PS tables the snapshot history); an older one is an error that
names the oldest still available.

The export is written into a temporary directory beside ``out`` and renamed into place, so a
killed export leaves no half-written ``out``. Each table is read whole into memory.
"""

from __future__ import annotations

import os
import shutil
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from cosparse.owner import owner_tag
from cosparse.ps.snapshot_format import SnapshotError
from cosparse.serving.dense import write_dense
from cosparse.serving.format import (
    FILE_FORMATS,
    FORMAT,
    VERSION,
    ServingError,
    write_manifest,
    write_removed,
    write_rows,
)
from cosparse.serving.item_index import is_retrieval, write_item_index
from cosparse.serving.rows import (
    Rows,
    changed,
    checkpoint_rows,
    in_checkpoint,
    ps_changed,
    ps_namespace,
    ps_rows,
    snapshot_dirs_exist,
    table_configs,
)
from cosparse.train.checkpoint import (
    CheckpointError,
    checkpoints,
    ps_metas,
    read_meta,
    resolve_checkpoint,
)


def ps_roots(meta: dict[str, Any], given: list[str] | None) -> list[Path]:
    """The data dir of each PS shard whose snapshots the checkpoint names: ``given`` (one per
    shard, in shard order), else the embedded shards' ``store.remote.data_dir/shard-<i>``."""
    n = int(meta["ps"]["num_shards"])
    if given:
        if len(given) != n:
            raise ServingError(f"--ps-root: given {len(given)} times, the checkpoint's PS had "
                               f"{n} shards (give each shard's --data-dir, in shard order)")
        return [Path(g) for g in given]
    remote = meta["config"]["store"]["remote"]
    if not remote.get("embedded") or not remote.get("data_dir"):
        raise ServingError("the checkpoint's rows are in the snapshots of external PS shards: "
                           "give each shard's --data-dir with --ps-root, in shard order")
    return [Path(remote["data_dir"]) / f"shard-{i}" for i in range(n)]


def _ps_saves(ck: Path, meta: dict[str, Any], roots: list[Path]) -> dict[int, list[str]]:
    """The steps whose PS snapshots are all still on disk, with those snapshots: the
    checkpoint's snapshot history and the snapshots of every kept checkpoint beside it."""
    entries = [*meta["ps"].get("history", []), meta["ps"], *(ps_metas(ck.parent) or [])]
    return {int(e["step"]): e["snapshots"] for e in entries
            if e.get("snapshots") and "step" in e and snapshot_dirs_exist(roots, e["snapshots"])}


def _kept_checkpoints(ck: Path) -> dict[int, Path]:
    return {int(p.name.removeprefix("step_")): p for p in checkpoints(ck.parent)}


def _check_since(since: int, step: int, available: set[int]) -> None:
    if since > step:
        raise ServingError(f"--since {since}: after the checkpoint's step {step}")
    if since in available:
        return
    if not available:
        raise ServingError(f"--since {since}: no earlier save's rows are left to compare with "
                           "(its checkpoint and PS snapshots are gone)")
    oldest = min(available)
    if since < oldest:
        raise ServingError(f"--since {since}: older than the oldest step still available, "
                           f"{oldest} (raise train.checkpoint.keep, or store.remote."
                           "snapshot_keep for rows on the PS, to keep more)")
    raise ServingError(f"--since {since}: no save was taken at that step; the steps available "
                       f"are {sorted(available)}")


def _rows_at(ck: Path, meta: dict[str, Any], since: int | None, roots: list[Path]
             ) -> tuple[dict[str, tuple[Rows, np.ndarray]], dict[str, dict[str, str]]]:
    """Per table (its rows, its removed IDs) and (its source, how changes were found)."""
    tables = table_configs(meta)
    local = in_checkpoint(meta)
    on_ps = [n for n in tables if n not in local]
    step = int(meta["step"])
    source = "sharded-checkpoint" if "sharded" in meta else "checkpoint"
    info = {n: {"source": source if n in local else "ps-snapshots", "method": "full"}
            for n in tables}
    none = np.zeros(0, np.int64)
    if since is None:
        rows = checkpoint_rows(ck, meta, local)
        if on_ps:
            rows.update(ps_rows(roots, meta["ps"]["snapshots"], tables, on_ps,
                                ps_namespace(meta)))
        return {n: (rows[n], none) for n in tables}, info
    kept = _kept_checkpoints(ck)
    ps_saves = _ps_saves(ck, meta, roots) if on_ps else {}
    available = set(kept) if local else set(ps_saves)
    if local and on_ps:
        available &= set(ps_saves)
    _check_since(since, step, available)
    out: dict[str, tuple[Rows, np.ndarray]] = {}
    if local:
        old = checkpoint_rows(kept[since], read_meta(kept[since]), local)
        new = checkpoint_rows(ck, meta, local)
        for n in local:
            out[n] = changed(old[n], new[n])
            info[n]["method"] = "diff"
    if on_ps:
        delta, method = ps_changed(roots, ps_saves[since], meta["ps"]["snapshots"], tables,
                                   on_ps, ps_namespace(meta))
        for n in on_ps:
            out[n] = (delta[n], none)
            info[n]["method"] = method
    return out, info


def _version() -> str:
    try:
        return metadata.version("cosparse")
    except metadata.PackageNotFoundError:
        return "unknown"


def export(checkpoint: str | Path, out: str | Path, since: int | None = None,
           fp16: bool = False, file_format: str = "parquet", ps_root: list[str] | None = None,
           shard_rows: int = 1_000_000) -> dict[str, Any]:
    """Write the export of ``checkpoint`` (a checkpoint directory, or a root whose LATEST names
    one) into the new directory ``out``; returns its manifest."""
    if file_format not in FILE_FORMATS:
        raise ServingError(f"--format: {file_format!r}, expected one of {list(FILE_FORMATS)}")
    if shard_rows < 1:
        raise ServingError("--shard-rows: must be at least 1")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ServingError(f"--out {out}: exists and is not empty (give a new directory)")
    ck = resolve_checkpoint(checkpoint)
    meta = read_meta(ck)
    if "tables" not in meta or "config" not in meta:
        raise CheckpointError(f"{ck}: not a trainer checkpoint (no tables or config in its "
                              "meta.json)")
    local = in_checkpoint(meta)
    needs_ps = any(n not in local for n in table_configs(meta))
    if needs_ps and meta.get("ps") is None:
        raise CheckpointError(f"{ck}: holds no rows of some tables and names no PS snapshots")
    roots = ps_roots(meta, ps_root) if needs_ps else []
    if needs_ps and not snapshot_dirs_exist(roots, meta["ps"]["snapshots"]):
        raise ServingError(f"{ck}: its PS snapshots {meta['ps']['snapshots']} are not all under "
                           f"{[str(r / 'snapshots') for r in roots]} (external shards: give "
                           "each shard's --data-dir with --ps-root, in shard order)")
    step = int(meta["step"])
    try:
        rows, info = _rows_at(ck, meta, since, roots)
    except SnapshotError as e:  # a PS snapshot that cannot be read: the export's input
        raise ServingError(f"reading the PS snapshots of {ck}: {e}") from e
    dtype = np.float16 if fp16 else np.float32
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{owner_tag()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        tables: dict[str, Any] = {}
        for name, (r, removed) in sorted(rows.items()):
            emb = r.emb.astype(dtype)
            if fp16 and not np.isfinite(emb).all() and np.isfinite(r.emb).all():
                raise ServingError(f"table '{name}': values beyond float16's range "
                                   "(export without --fp16)")
            files = write_rows(tmp, name, r.ids, emb, file_format, shard_rows)
            files += write_removed(tmp, name, removed)
            tables[name] = {"dim": int(r.emb.shape[1]), "dtype": np.dtype(dtype).name,
                            "rows": int(r.ids.shape[0]), "removed": int(removed.shape[0]),
                            **info[name], "files": files}
        manifest = {"format": FORMAT, "version": VERSION,
                    "kind": "full" if since is None else "delta",
                    "step": step, "since": since, "step_range": [since or 0, step],
                    "versions": {"export": VERSION,
                                 "checkpoint_format": meta.get("format_version"),
                                 "cosparse": _version()},
                    "checkpoint": str(ck.resolve()), "dtype": np.dtype(dtype).name,
                    "file_format": file_format, "tables": tables,
                    "dense": write_dense(ck, meta, tmp)}
        write_manifest(tmp, manifest)
        if since is None and is_retrieval(meta["config"]) and manifest["dense"]["form"]:
            from cosparse.serving.predictor import load

            manifest["retrieval"] = write_item_index(tmp, meta["config"],
                                                     load(tmp, use_program=False))
            write_manifest(tmp, manifest)
        if out.exists():
            out.rmdir()  # (empty: checked above)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest
