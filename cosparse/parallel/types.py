"""Plain data of the parallel engine: each table's sharding, the plan for all tables, and what
the planner predicts for a plan."""

from __future__ import annotations

from dataclasses import dataclass, field

from cosparse.config import ShardingKind

# how a sharding routes a table's IDs to its owners: every owner gets every ID ("all"), or each
# ID goes to the one owner that its row hash names ("hash")
ROUTE = {"data_parallel": "all", "table_wise": "all", "column_wise": "all",
         "row_wise": "hash", "table_row_wise": "hash"}


@dataclass(frozen=True)
class TableSharding:
    """One table over the ranks: ``owners`` hold a shard each (a full table placement), in shard
    order; ``columns[i]`` is owner i's column range [c0, c1) (column-wise; else the whole row)."""

    table: str
    kind: ShardingKind
    owners: tuple[int, ...]
    columns: tuple[tuple[int, int], ...]

    @property
    def route(self) -> str:
        return ROUTE[self.kind]

    @property
    def replicated(self) -> bool:
        return self.kind == "data_parallel"

    def shard_of(self, rank: int) -> int | None:
        """This rank's shard index, or None when it holds none."""
        return self.owners.index(rank) if rank in self.owners else None


@dataclass
class PlanCost:
    """What the planner predicts for one plan, per step: bytes on each link (summed over
    ranks), and bytes held per rank."""

    link_bytes: dict[str, float] = field(default_factory=dict)  # rank_rank, worker_ps, ...
    sent_bytes: list[float] = field(default_factory=list)  # per rank, to other ranks
    ps_bytes: list[float] = field(default_factory=list)  # per rank, to and from the PS
    held_bytes: list[float] = field(default_factory=list)  # per rank: its shards' rows
    seconds: float = 0.0  # the link time of the busiest rank: what the planner minimises
    link_gbps: float = 0.0


@dataclass
class ShardingPlan:
    """Every table's sharding, for one world; ``cost``: the planner's prediction, if it made one."""

    world_size: int
    ranks_per_node: int
    tables: dict[str, TableSharding]
    cost: PlanCost | None = None
    chosen_by: dict[str, str] = field(default_factory=dict)  # table -> "pinned" | "planner"

    def describe(self) -> str:
        lines = [f"sharding over {self.world_size} rank(s) ({self.ranks_per_node} per node):"]
        for name, s in self.tables.items():
            how = self.chosen_by.get(name, "planner")
            lines.append(f"  {name}: {s.kind} on ranks {list(s.owners)} ({how})")
        if self.cost is not None:
            c = self.cost
            links = ", ".join(f"{k} {v / 1e6:,.3f} MB" for k, v in c.link_bytes.items())
            ps = f" and moves {max(c.ps_bytes) / 1e6:,.3f} MB to and from the PS" \
                if c.ps_bytes else ""
            lines.append(f"  predicted per step: {links} in all; the busiest rank sends "
                         f"{max(c.sent_bytes) / 1e6:,.3f} MB{ps} ({c.seconds * 1e3:,.2f} ms at "
                         f"{c.link_gbps:g} Gbit/s)")
            lines.append(f"  rows held per rank: {min(c.held_bytes) / 2**20:,.2f} to "
                         f"{max(c.held_bytes) / 2**20:,.2f} MiB ({sum(c.held_bytes) / 2**20:,.2f} "
                         "MiB in all, by train.steps, from the vocabulary's growth)")
        return "\n".join(lines)


@dataclass
class TableStats:
    """What the sharding planner knows of one table, from the first batches of the reader."""

    rows: int  # rows the table will hold (its vocabulary, or an estimate of it)
    row_bytes: int  # values and optimizer state of one row
    dim: int
    features: int
    ids_per_sample: float  # IDs per sample, over all its features
    unique_per_batch: float  # distinct rows in one global batch
    pooled: bool
    distinct: int = 0  # distinct rows over the statistics' batches
    # hotness, from the capacity planner: (share of the distinct rows a cache holds, rows it
    # fetches per unique row looked up, rows it evicts per unique row looked up), shares
    # ascending; empty: unknown (every row fetched)
    hotness: tuple[tuple[float, float, float], ...] = ()


@dataclass(frozen=True)
class PSSupply:
    """A PS beneath every shard (architecture B, or tiers over the PS): the link a shard's
    misses come over, and the rows its tiers hold of each table (None: every row it owns)."""

    pull_link: str  # "worker_ps" (B: the data workers bring them) or "trainer_ps.pull"
    cache_rows: dict[str, int | None] = field(default_factory=dict)
