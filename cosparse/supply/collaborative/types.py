"""Plain data of the collaborative supply: delivered rows and the supply's counters."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np


@dataclass
class DeliveredRows:
    """Rows one worker pulled for one table of one batch, as the PS had them at pull time."""

    ids: np.ndarray  # int64 [n], sorted, unique
    rows: np.ndarray  # float32 [n, dim + state]
    counters: np.ndarray  # int64 [num_shards], each shard's write counter at pull (-1: not asked)

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes)


@dataclass
class Delivery:
    """What a batch brought besides its samples."""

    rows: dict[str, DeliveredRows] = field(default_factory=dict)
    worker_ps_bytes: int = 0  # bytes the worker moved on its PS link for this batch
    worker_pid: int = 0
    error: str | None = None  # the pull that failed (the rows not pulled after it are absent)


@dataclass
class SupplyCounters:
    """Cumulative counters of the collaborative supply (all from the real code path)."""

    batches: int = 0
    delivered_rows: int = 0
    delivered_bytes: int = 0
    used_rows: int = 0  # delivered rows that filled a device miss
    wasted_rows: int = 0  # delivered rows the trainer already held
    wasted_bytes: int = 0
    stale_drops: int = 0  # delivered rows older than the trainer's last write-back
    worker_ps_bytes: int = 0
    publishes: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
