"""The ``tables`` section: each embedding table's features, rows, optimizer and initial values,
and its rules."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from cosparse.config.errors import ConfigError

if TYPE_CHECKING:
    from cosparse.config.root import Config


@dataclass
class OptimizerConfig:
    kind: Literal["sgd", "adagrad", "rowwise_adagrad", "adam"] = "rowwise_adagrad"
    lr: float = 0.01
    eps: float = 1e-8
    beta1: float = 0.9
    beta2: float = 0.999
    initial_accumulator: float = 0.0
    # L2 regularisation of the rows a batch touches: their gradient gets l2 * row added before
    # the update, inside the kernel (rows no batch touches do not decay)
    l2: float = 0.0


@dataclass
class InitConfig:
    kind: Literal["uniform", "normal"] = "uniform"
    low: float = -0.05
    high: float = 0.05
    std: float = 0.01


@dataclass
class TableConfig:
    name: str = ""
    dim: int = 16
    # auto: every ID column of data.columns that no other table names (resolved at start-up)
    features: list[str] | Literal["auto"] = field(default_factory=list)
    pooling: Literal["sum", "mean", "none"] = "sum"  # none: every ID its own row (sequences)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    init: InitConfig = field(default_factory=InitConfig)
    seed: int = 0
    # expected rows of an all-resident table: sizes its first allocation (tiers and the PS size
    # themselves; validate_store refuses it there)
    num_embeddings: int | None = None
    hash_size: int | None = None  # only when set: IDs are taken modulo this (fixed-size table)
    # fixed: the IDs are dense row numbers below hash_size (which it needs); an all-resident table
    # then skips the ID map and creates its hash_size rows at start-up (other placements keep
    # their maps: the rows are the same). dynamic: rows are created as IDs first appear
    vocab: Literal["dynamic", "fixed"] = "dynamic"
    policy: Literal["lru", "lfu", "hotness"] | None = None  # overrides store.device.policy
    # set by column-wise sharding (``cosparse.parallel``), never by hand: the whole row's column of
    # this shard's column 0, so that a shard's initial values are those columns of the whole row
    column_offset: int = 0
    # set by row-wise sharding, never by hand: [shard, shards], this shard holds the rows whose
    # row_owner (cosparse.store.dedup) is `shard` (a data worker delivers only those)
    rows_of: list[int] | None = None
    # set by column-wise sharding, never by hand: this column shard's own table on the PS
    # (``remote_name``), since a PS table holds whole rows of one width
    ps_name: str = ""
    # NAMESPACE/TABLE: use that table of another PS namespace on purpose (its rows, shared with
    # that namespace's model); its dim, initialiser and optimizer must agree (the shards check)
    shared_as: str = ""

    @property
    def remote_name(self) -> str:
        """The table's name on the PS (``NAMESPACE/TABLE`` when it is shared into another
        namespace; without a namespace: in the client's own)."""
        return self.ps_name or self.shared_as or self.name


def validate_tables(cfg: Config) -> None:
    """One table at least, each named once, with features (or a spec that gives them), every
    feature served by one table, and ``init.low <= init.high``."""
    if not cfg.tables:
        raise ConfigError("tables: at least one table is needed")
    seen_tables: set[str] = set()
    seen_features: dict[str, str] = {}
    autos = 0
    for i, t in enumerate(cfg.tables):
        k = f"tables[{i}]"
        if not t.name:
            raise ConfigError(f"{k}.name: every table needs a name")
        if t.name in seen_tables:
            raise ConfigError(f"{k}.name: table '{t.name}' is declared twice")
        seen_tables.add(t.name)
        if not t.features and not cfg.features.spec:  # a spec fills them from its consumer
            raise ConfigError(f"{k}.features: table '{t.name}' has no features")
        if t.vocab == "fixed" and t.hash_size is None:
            raise ConfigError(f"{k}.vocab: 'fixed' takes the IDs modulo {k}.hash_size, the "
                              f"number of rows: set it (e.g. hash_size: 1000000)")
        if t.features == "auto":
            _check_shared_as(t, k)
            _check_auto(cfg, k, autos)
            autos += 1
            continue
        for f in t.features:
            if f in seen_features:
                raise ConfigError(
                    f"{k}.features: feature '{f}' is already served by table '{seen_features[f]}'"
                )
            seen_features[f] = t.name
        _check_shared_as(t, k)
        if t.init.low > t.init.high:
            raise ConfigError(f"{k}.init.low: {t.init.low} is above {k}.init.high "
                              f"({t.init.high})")


def _check_auto(cfg: Config, key: str, autos: int) -> None:
    """``features: auto`` takes the ID columns of data.columns, for one table."""
    d = cfg.data
    user_items = d.reader == "interactions" and d.events.layout == "user_items"
    if cfg.features.spec or (d.reader not in ("csv", "libsvm") and not user_items
                             and (d.columns is None or d.reader == "taobao_events")):
        raise ConfigError(f"{key}.features: 'auto' takes the columns of data.columns (reader "
                          "csv or libsvm, parquet or interactions with data.columns, or a "
                          "user_items file), without features.spec")
    if autos:
        raise ConfigError(f"{key}.features: one table may say 'auto', not two")


def _check_shared_as(t: TableConfig, key: str) -> None:
    """``shared_as`` names a table of a namespace: ``NAMESPACE/TABLE``."""
    if not t.shared_as:
        return
    from cosparse.config.store import PS_NAME_PATTERN

    ns, sep, name = t.shared_as.partition("/")
    if not sep or not re.match(PS_NAME_PATTERN, ns) or not re.match(PS_NAME_PATTERN, name):
        raise ConfigError(f"{key}.shared_as: {t.shared_as!r} is not NAMESPACE/TABLE (each 1 to "
                          "128 letters, digits, '_', '.', '-'), e.g. 'ctr/user_id'")
