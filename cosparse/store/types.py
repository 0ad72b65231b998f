"""Plain data of the store and its one table interface: ``TablePlacement`` (implemented by the
resident, tiered, ps-direct and ps-cached tables), ``TierPlan``, tier counters, capacity errors."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import numpy as np
import torch


@dataclass
class TierPlan:
    """Where one table's rows live: a bounded device tier over a host tier (and a spill store)."""

    device_rows: int
    host_rows: int | None = None
    spill: bool = False
    device_policy: str = "hotness"
    host_policy: str = "lfu"
    decay: float = 0.99
    ttl_steps: int = 0  # rows untouched this many batches are dropped from every tier (0: off)


@dataclass
class BatchPlan:
    """One table's plan for one batch: the device slot of each unique ID, which were hits, and
    the misses with the slots reserved for them (victims already evicted). ``fill`` brings the
    misses' rows in; ``fill_ms`` is the time it took."""

    slots: np.ndarray  # int64 [U], device slot per unique ID (reserved for the misses)
    hits: np.ndarray  # bool [U]
    miss_ids: np.ndarray  # int64 [M]
    miss_slots: np.ndarray  # int64 [M]
    victims: int = 0  # device rows evicted to make room
    seq: int = 0  # the batch's sequence number
    fill_ms: float = 0.0

    @classmethod
    def resident(cls, slots: np.ndarray, seq: int) -> BatchPlan:
        """Every row already in place: nothing to fill."""
        none = np.zeros(0, dtype=np.int64)
        return cls(slots, np.ones(slots.shape[0], dtype=np.bool_), none, none, 0, seq)


@dataclass
class FillTarget:
    """The device rows a batch's misses go to, and what the row sources say of each: hotness
    (``counts``, ``last``) and whether the tier below lacks an identical copy (``dirty``)."""

    tier: Any  # the device Tier
    ids: np.ndarray
    slots: np.ndarray
    counts: np.ndarray
    last: np.ndarray
    dirty: np.ndarray
    # set by a source that fills its rows later (``RemoteBatch``, at the end of the plan)
    later: Any = None

    @classmethod
    def of(cls, tier: Any, ids: np.ndarray, slots: np.ndarray) -> FillTarget:
        n = ids.shape[0]
        return cls(tier, ids, slots, np.zeros(n, np.float32), np.zeros(n, np.int64),
                   np.ones(n, np.bool_))


class RowSource(Protocol):
    """One place a device miss can come from: the host tier, rows delivered with the batch, the
    remote PS, an in-process backing store, or the row's initial value. ``fill`` writes the
    rows it holds of ``target.ids[todo]`` into their device slots and returns the positions it
    did not serve; a placement walks its sources in order until none are left."""

    def fill(self, target: FillTarget, todo: np.ndarray) -> np.ndarray: ...


class CapacityError(RuntimeError):
    """A tier cannot hold what the run needs (e.g. one batch's unique rows on the device)."""


@dataclass
class TableCounters:
    """Cumulative counters of one tiered table; every figure comes from the real code path."""

    lookups: int = 0  # unique IDs planned (sum over batches)
    device_hits: int = 0
    host_hits: int = 0
    backing_hits: int = 0  # misses filled from the tier below the host (the PS: a trainer pull)
    delivered_hits: int = 0  # misses filled from rows a data worker delivered (architecture B)
    fresh_rows: int = 0  # rows created from their initial value
    evictions_device: int = 0
    evictions_host: int = 0
    writebacks_device: int = 0  # dirty device victims written to the host
    bytes_host_device: int = 0
    bytes_device_host: int = 0
    bytes_backing_device: int = 0
    bytes_host_backing: int = 0
    bytes_delivered_device: int = 0
    ttl_drops: int = 0  # rows dropped from every tier by the TTL
    extra: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}

    def minus(self, other: TableCounters) -> dict[str, int]:
        a, b = self.as_dict(), other.as_dict()
        return {k: a[k] - b[k] for k in a}

    def copy(self) -> TableCounters:
        return TableCounters(**self.as_dict())


class DeliveredRowSource(Protocol):
    """Rows that arrived with a batch from elsewhere (a data worker's PS pull)."""

    def take(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...  # (served mask, rows)


class DeliveryHook(Protocol):
    """Rows that came with a batch (architecture B), as a ``DeliveredRowSource`` per table, and
    their bookkeeping once the batch is planned."""

    def sources(self, delivery: object) -> Mapping[str, DeliveredRowSource] | None: ...

    def settle(self, sources: Mapping[str, DeliveredRowSource]) -> None: ...


class RemoteRows(Protocol):
    """What the tiers need from a remote store beneath the host (the PS client provides it)."""

    def pull(self, table: str, ids: np.ndarray, with_state: bool = False, peek: bool = False
             ) -> Any: ...  # .rows [n, dim(+state)]

    def push_rows(self, table: str, ids: np.ndarray, rows: np.ndarray) -> Any: ...

    def pull_many(self, asks: list[tuple[str, np.ndarray]], with_state: bool = False,
                  peek: bool = False) -> list[Any]: ...  # one round trip

    def push_rows_many(self, writes: list[tuple[str, np.ndarray, np.ndarray]]) -> Any: ...

    def dump(self, table: str) -> tuple[np.ndarray, np.ndarray]: ...


class TablePlacement(Protocol):
    """One table's rows wherever they live. The embedding collection and the planner see only
    this: plan a batch's unique IDs in order (pinning its rows for the lookahead window), fill
    its misses from the placement's row sources, gather them for the forward, apply the
    optimizer, write the update back, release the batch; flush, export and load."""

    row_bytes: int
    counters: TableCounters | None  # None: nothing is cached (all resident, or ps-direct)
    pins_rows: bool  # planning pins rows, so batches in flight must be bounded by the lookahead
    rows_on_ps: bool  # every row lives on the PS: its snapshots hold them, not this process
    ps_backed: bool  # the PS holds every row this process does not (a restored PS suffices)
    late_fill_ms: float  # time spent filling rows at the gather, not at the plan

    def map_ids(self, ids: np.ndarray) -> np.ndarray: ...

    def plan(self, unique: np.ndarray, seq: int, shrink: Any) -> BatchPlan: ...

    def row_sources(self, delivered: DeliveredRowSource | None) -> list[RowSource]: ...

    def fill(self, plan: BatchPlan, sources: list[RowSource]) -> None: ...

    def gather(self, slots: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]: ...

    def apply_gradients(self, w: torch.Tensor, s: torch.Tensor, g: torch.Tensor,
                        slots: np.ndarray, step: int) -> None: ...

    def write_back(self, step: int) -> None: ...  # the last batch's updates to where rows live

    def release(self, seq: int) -> None: ...

    def release_all(self) -> None: ...

    def observe_future(self, unique: np.ndarray, delta: int) -> None: ...

    def read_rows(self, unique: np.ndarray) -> torch.Tensor: ...

    def device_bytes(self) -> tuple[int, int]: ...  # (held, capacity) of a bounded device tier

    def flush(self) -> None: ...

    def export(self) -> dict[str, np.ndarray]: ...

    def load(self, state: dict[str, np.ndarray]) -> None: ...

    def drop_local_rows(self) -> None: ...  # a restored PS holds every row
