"""Plain data of the store: tier counters and capacity errors."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import numpy as np


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


class RemoteRows(Protocol):
    """What the tiers need from a remote store beneath the host (the PS client provides it)."""

    def pull(self, table: str, ids: np.ndarray, with_state: bool = False, peek: bool = False
             ) -> Any: ...  # .rows [n, dim(+state)]

    def push_rows(self, table: str, ids: np.ndarray, rows: np.ndarray) -> Any: ...

    def dump(self, table: str) -> tuple[np.ndarray, np.ndarray]: ...
