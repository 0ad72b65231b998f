"""What a rank holds of each table: which rows (a hash of the row key names the owner of a
row-wise table's row) and which columns, as the table configs of its own embedding collection."""

from __future__ import annotations

import dataclasses

import numpy as np

from cosparse.config import TableConfig
from cosparse.parallel.types import ShardingPlan, TableSharding
from cosparse.store.dedup import row_owner

__all__ = ["column_ranges", "rank_tables", "row_owner", "shard_config", "sharding_of"]


def column_ranges(dim: int, shards: int) -> tuple[tuple[int, int], ...]:
    """``dim`` columns split into ``shards`` contiguous ranges, the first ones one wider."""
    edges = np.linspace(0, dim, shards + 1).round().astype(int)
    return tuple((int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True))


def shard_config(cfg: TableConfig, sharding: TableSharding, rank: int) -> TableConfig:
    """The table config of ``rank``'s shard: its columns, its rows (``rows_of``: the row
    keys whose ``row_owner`` is this shard), and sum pooling where the shard pools part of a
    row-wise bag (the receiver divides a mean by the whole bag's length); a column shard has its
    own table on the PS (``ps_name``: ``T.cols0-4``). ``hash_size`` stays:
    the sender maps IDs to row keys already, and the mapping is idempotent."""
    c0, c1 = sharding.columns[sharding.owners.index(rank)]
    pooling = cfg.pooling
    if sharding.route == "hash" and pooling == "mean":
        pooling = "sum"
    rows_of = [sharding.owners.index(rank), len(sharding.owners)] if sharding.route == "hash" \
        else None
    offset = cfg.column_offset + c0
    ps_name = f"{cfg.shared_as or cfg.name}.cols{offset}-{offset + c1 - c0}" \
        if sharding.kind == "column_wise" \
        else cfg.ps_name
    return dataclasses.replace(cfg, dim=c1 - c0, column_offset=offset, pooling=pooling,
                               rows_of=rows_of, ps_name=ps_name)


def rank_tables(plan: ShardingPlan, tables: list[TableConfig], rank: int) -> list[TableConfig]:
    """The shard configs ``rank`` holds, in table order."""
    return [shard_config(t, plan.tables[t.name], rank) for t in tables
            if rank in plan.tables[t.name].owners]


def sharding_of(kind: str, table: TableConfig, world: int, ranks_per_node: int,
                home: int = 0, column_owners: tuple[int, ...] | None = None) -> TableSharding:
    """The owners and columns of ``kind`` for ``table``; ``home``: the rank (table-wise) or node
    (table-row-wise) that holds it; ``column_owners``: the ranks of a column-wise table's shards
    (default: ranks 0 to min(world, dim) - 1)."""
    whole = ((0, table.dim),)
    if kind == "data_parallel":
        owners = tuple(range(world))
        return TableSharding(table.name, kind, owners, whole * world)  # type: ignore[arg-type]
    if kind == "table_wise":
        return TableSharding(table.name, kind, (home,), whole)  # type: ignore[arg-type]
    if kind == "column_wise":
        owners = column_owners or tuple(range(min(world, table.dim)))
        return TableSharding(table.name, kind, owners,  # type: ignore[arg-type]
                             column_ranges(table.dim, len(owners)))
    if kind == "row_wise":
        return TableSharding(table.name, kind, tuple(range(world)),  # type: ignore[arg-type]
                             whole * world)
    if kind == "table_row_wise":
        owners = tuple(range(home * ranks_per_node, (home + 1) * ranks_per_node))
        return TableSharding(table.name, kind, owners, whole * len(owners))  # type: ignore[arg-type]
    raise ValueError(f"unknown sharding kind '{kind}'")
