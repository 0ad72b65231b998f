"""The ``parallel`` section: how a run under ``torchrun`` spreads over its ranks (the dense
model's data parallelism, each table's sharding, the link the sharding planner prices), and its
rules. One process without the section trains as it always has."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from cosparse.config.errors import ConfigError
from cosparse.config.sizes import parse_bytes

if TYPE_CHECKING:
    from cosparse.config.root import Config

ShardingKind = Literal["data_parallel", "table_wise", "column_wise", "row_wise", "table_row_wise"]


@dataclass
class ParallelConfig:
    # ranks per node; None: torchrun's LOCAL_WORLD_SIZE (a given value must agree with it)
    ranks_per_node: int | None = None
    backend: Literal["auto", "gloo", "nccl"] = "auto"  # auto: nccl on CUDA, else gloo
    dense: Literal["ddp", "fsdp2"] = "ddp"
    # how each global batch is split over the ranks (contiguous either way): equal samples, or
    # equal IDs (long sequences); auto: ids when a table is unpooled (behaviour sequences)
    balance: Literal["auto", "samples", "ids"] = "auto"
    # per-table sharding pins, {table: kind}; the sharding planner chooses for the others
    sharding: dict[str, ShardingKind] = field(default_factory=dict)
    # what the planner prices: the rank-to-rank link, and the budgets of one rank
    link_gbps: float = 100.0
    device_budget_bytes: int | str | None = None  # None: store.device.budget_bytes
    host_budget_bytes: int | str | None = None  # None: unbounded
    # tables below this many bytes (rows x row bytes) may be replicated on every rank
    replicate_below_bytes: int | str = "4MiB"


def validate_parallel(cfg: Config) -> None:
    """Pins name tables; column-wise splits a row only where a row's optimizer state does not
    span its columns."""
    par = cfg.parallel
    for k in ("device_budget_bytes", "host_budget_bytes", "replicate_below_bytes"):
        value = getattr(par, k)
        if value is not None:
            setattr(par, k, parse_bytes(value, f"parallel.{k}"))
    names = {t.name: t for t in cfg.tables}
    if not names:  # (a model's EmbeddingBagCollection brings them: checked once it has)
        return
    for table, kind in cfg.parallel.sharding.items():
        key = f"parallel.sharding.{table}"
        if table not in names:
            raise ConfigError(f"{key}: no table is named '{table}' (tables: "
                              f"{', '.join(names)})")
        t = names[table]
        if kind == "column_wise" and t.optimizer.kind == "rowwise_adagrad":
            raise ConfigError(
                f"{key}: column_wise splits a row's columns over ranks, but "
                f"tables[{table}].optimizer.kind rowwise_adagrad keeps one state for the whole "
                "row; use table_wise or row_wise, or an element-wise optimizer (sgd, adagrad, "
                "adam)")
