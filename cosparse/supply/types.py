"""The seam between the trainer and how rows reach it: the ``SupplyPath`` interface and what it
is built from.

A supply path (``resident`` or tiered rows in this process, ``ps-direct``: architecture A, or
``collaborative``: architecture B) owns everything of its own: PS shard processes and clients,
shared memory, the data workers' codec, fallback, PS snapshots, and its counters. The trainer
calls it through this interface and imports none of its modules (an import-linter contract).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from cosparse.link import Links
from cosparse.store.types import DeliveryHook, TablePlacement, TierPlan


class SnapshotMismatch(RuntimeError):
    """The PS does not hold the snapshots a checkpoint names."""


@dataclass
class PathContext:
    """What a supply path is built from, besides the config."""

    device: torch.device
    links: Links
    train_reader: Any  # the training batches' reader (B's workers build batches with it)
    log: Callable[[str], None]


class SupplyPath(Protocol):
    """How rows reach the trainer. ``start`` once (with the tier plans), then ``placements``
    for each (re)built embedding collection."""

    name: str
    below: str  # what fills a device miss from below the host: 'trainer_ps' or 'backing'
    rows_on_ps: bool  # the PS snapshots its rows itself: checkpoints name the snapshots
    stream_errors: tuple[type[BaseException], ...]  # data-stream failures the path handles

    def start(self, plans: dict[str, TierPlan] | None) -> None: ...

    def placements(self) -> dict[str, TablePlacement]: ...

    @property
    def delivery(self) -> DeliveryHook | None: ...

    @property
    def codec(self) -> Any: ...  # what the data workers encode batches with (None: plain)

    def describe(self) -> str | None: ...

    def endpoints(self) -> list[str]: ...  # the PS shards it reached or started (none: [])

    # --- per step -------------------------------------------------------------------------
    def on_step(self, step: int) -> None: ...

    def health(self) -> str | None: ...

    def fall_back(self, reason: str, step: int) -> None: ...

    # architecture B only: steps between two publications of the resident filter, from now on
    def set_publish_every(self, steps: int) -> None: ...

    # architecture B only: 'ps-tiered' stops the workers' rows (the trainer pulls its misses
    # over the same tiers, as after a fallback), 'collaborative' starts them again
    def set_path(self, name: str, step: int) -> None: ...

    # --- checkpoints ----------------------------------------------------------------------
    def refuse_stale(self) -> None: ...

    def snapshot(self, full: bool) -> dict[str, Any]: ...

    def prune(self, metas: list[dict[str, Any]]) -> None: ...

    # every row of a PS table with its optimizer state ({"ids", "rows"}): a table that a
    # checkpoint holds on the PS only, for a layout that keeps it under another name there
    def read_ps_table(self, name: str) -> dict[str, Any]: ...

    # ``endpoints``: shards another process (rank 0 of many) restarted from the snapshots
    def restore(self, meta: dict[str, Any], endpoints: list[str] | None = None) -> bool: ...

    # --- metrics and lifetime -------------------------------------------------------------
    def counters(self) -> dict[str, float]: ...

    def gauges(self) -> dict[str, float]: ...

    def close(self) -> None: ...
