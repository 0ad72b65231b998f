"""Checkpoints of a many-rank run, written collectively through ``torch.distributed.checkpoint``
(DCP), and resumed at any world size and sharding.

One commit (``step_NNNNNNNN``, the same directory, ``LATEST`` and pruning as one process's
checkpoints) holds every rank's shards of every table (IDs, rows and their optimizer state, and
a tiered shard's placement hints: the rows its device tier held), the
dense model and its optimizer (DCP's own state dicts: DDP or FSDP2 alike), and ``meta.json``
naming the sharding they were saved under. Each rank writes its own shards; rank 0 commits,
once every rank's part is on disk. Over a shared PS, rank 0 first has the shards snapshot their
rows, and the commit names the snapshots (architecture A's ranks hold no rows of their own: the
snapshots are its rows).

Resuming reads, for each table a rank holds now, the shards of the saved layout, merges them
into the whole table and keeps its own part (``cosparse.parallel.reshard``): 2 ranks to 1, 1 to
3, table-wise to row-wise. A one-process checkpoint resumes on many ranks the same way.
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from cosparse.config import TableConfig
from cosparse.owner import owner_tag
from cosparse.parallel.reshard import merge_shards, split_table
from cosparse.parallel.types import ShardingPlan, TableSharding
from cosparse.train.checkpoint import (
    CheckpointError,
    TrainState,
    commit_checkpoint,
    write_meta,
)

_DCP = "dcp"


def _dcp_load(state: dict[str, Any], **where: Any) -> None:
    """DCP's load, collective under a process group; one process's (resuming a many-rank
    checkpoint) without one, which DCP warns of though it is meant here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(state, no_dist=not dist.is_initialized(), **where)


def _rows_key(table: str, shard: int, part: str) -> str:
    return f"{table}.{shard}.{part}"


def _shard_rows(ec: Any) -> dict[str, torch.Tensor]:
    """This rank's shards' rows (dirty device rows flushed first), keyed table.shard.part;
    a replicated table is written by its first replica only. Architecture A's ranks shard
    nothing (``ec`` is not sharded): its rows are the PS's, in its snapshots."""
    out: dict[str, torch.Tensor] = {}
    if getattr(ec, "plan", None) is None:
        return out
    rank = ec.world.rank
    for name, rows in ec.inner.export_rows().items():
        s = ec.plan.tables[name]
        i = s.owners.index(rank)
        if s.replicated and i:
            continue
        for part in ("ids", "rows", "device_ids"):  # (device_ids: a tiered shard's hints)
            if part in rows:
                out[_rows_key(name, i, part)] = torch.from_numpy(np.ascontiguousarray(rows[part]))
    return out


def _plan_meta(plan: ShardingPlan | None, world: Any) -> dict[str, Any]:
    """The sharding the rows were saved under (none under architecture A: no rows saved)."""
    if plan is None:
        return {"world_size": world.size, "ranks_per_node": world.ranks_per_node, "tables": {}}
    return {"world_size": plan.world_size, "ranks_per_node": plan.ranks_per_node,
            "tables": {n: {"kind": s.kind, "owners": list(s.owners),
                           "columns": [list(c) for c in s.columns]}
                       for n, s in plan.tables.items()}}


def saved_sharding(meta: dict[str, Any]) -> dict[str, TableSharding]:
    return {n: TableSharding(n, t["kind"], tuple(t["owners"]),
                             tuple(tuple(c) for c in t["columns"]))
            for n, t in meta["sharded"]["tables"].items()}


def save_sharded(root: str | Path, state: TrainState, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, ec: Any, world: Any, config: dict[str, Any],
                 keep: int, before_commit: Callable[[], dict[str, Any]] | None = None) -> Path:
    """Every rank calls this at the same step; returns the committed directory.

    ``before_commit`` runs on rank 0 once every rank's part is on disk (and every rank's
    write-backs reached the PS), before anything is committed: the PS shards snapshot their
    rows, and what it returns (the snapshot names) goes into the metadata."""
    root = Path(root)
    final = root / f"step_{state.step:08d}"
    name: list[Any] = [f".tmp-{final.name}-{owner_tag()}" if world.leader else None]
    dist.broadcast_object_list(name, src=0)  # rank 0's tag: the sweep judges its process
    tmp = root / name[0]
    if world.leader:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    dist.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    try:
        dcp.save({"model": model_sd, "optim": optim_sd, "rows": _shard_rows(ec)},
                 checkpoint_id=tmp / _DCP)
    except BaseException:
        if world.leader:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    dist.barrier()  # every rank's rows written, and written back to the PS
    failure: list[Any] = [None]
    if world.leader:
        try:
            extra = before_commit() if before_commit is not None else {}
            write_meta(tmp, {**extra, "step": state.step, "epoch": state.epoch,
                             "batch_in_epoch": state.batch_in_epoch, "tables": [],
                             "config": config,
                             "sharded": _plan_meta(getattr(ec, "plan", None), world)})
            commit_checkpoint(root, tmp, final, keep)
        except BaseException as e:  # noqa: BLE001 - told to every rank, then raised here
            shutil.rmtree(tmp, ignore_errors=True)
            failure[0] = f"{type(e).__name__}: {e}"
    dist.broadcast_object_list(failure, src=0)
    if failure[0] is not None:
        raise CheckpointError(f"committing the checkpoint of step {state.step} under {root} "
                              f"failed on rank 0: {failure[0]}; nothing of it was committed")
    return final


def load_sharded_rows(ck: Path, meta: dict[str, Any], tables: list[TableConfig],
                      wanted: list[str]) -> dict[str, dict[str, np.ndarray]]:
    """The whole rows of the ``wanted`` tables from a sharded checkpoint (every rank calls
    this together under a process group: DCP's load is collective)."""
    saved = saved_sharding(meta)
    reader = dcp.FileSystemReader(str(ck / _DCP))
    md = reader.read_metadata().state_dict_metadata
    rows: dict[str, torch.Tensor] = {}
    for name in wanted:
        for i in range(1 if saved[name].replicated else len(saved[name].owners)):
            for part in ("ids", "rows", "device_ids"):
                key = _rows_key(name, i, part)
                m = md.get(f"rows.{key}")
                if m is not None:  # (device_ids: only where the shard was tiered)
                    rows[key] = torch.empty(tuple(m.size), dtype=m.properties.dtype)
    _dcp_load({"rows": rows}, storage_reader=reader)
    by_name = {t.name: t for t in tables}
    out = {}
    for name in wanted:
        s = saved[name]
        n = 1 if s.replicated else len(s.owners)
        parts = [{part: rows[_rows_key(name, i, part)].numpy()
                  for part in ("ids", "rows", "device_ids") if _rows_key(name, i, part) in rows}
                 for i in range(n)]
        out[name] = merge_shards(by_name[name], s if not s.replicated else
                                 TableSharding(name, "table_wise", s.owners[:1], s.columns[:1]),
                                 parts)
    return out


def load_sharded_dense(ck: Path, model: torch.nn.Module,
                       optimizer: torch.optim.Optimizer) -> None:
    """The dense model and its optimizer from a sharded checkpoint, into any wrapping."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    sd = {"model": model_sd, "optim": optim_sd}
    _dcp_load(sd, checkpoint_id=ck / _DCP)
    set_state_dict(model, optimizer, model_state_dict=sd["model"],
                   optim_state_dict=sd["optim"])


def my_shards(whole: dict[str, dict[str, np.ndarray]], tables: list[TableConfig],
              plan: ShardingPlan, rank: int) -> dict[str, dict[str, np.ndarray]]:
    """This rank's part of each whole table it holds under ``plan`` (of those in ``whole``)."""
    out = {}
    for t in tables:
        s = plan.tables[t.name]
        if rank in s.owners and t.name in whole:
            out[t.name] = split_table(t, s, s.owners.index(rank), whole[t.name])
    return out
