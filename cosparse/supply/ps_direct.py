"""Architecture A's placements: every row lives on the remote parameter server.

``PSDirectTable``: each batch the trainer pulls the unique rows it needs (one batched request
per shard, all shards in parallel), trains, and pushes the row gradients back (``write_back``);
the shards apply the same optimizer kernels. Prefetch stays exact by ordering. Batch p is
planned (its rows pulled) while up to ``lookahead`` earlier batches may still be training; rows
that one of those batches will update are not pulled then, but right before batch p trains,
when every earlier push has completed. Which IDs are deferred depends only on the data, so the
bytes moved are deterministic too.

``PSCachedTable``: the same with a device cache of hot rows: the ``DeviceCache`` of the tiered
store over the PS as its one row source, written through (the optimizer updates cached rows in
place with the same kernel and the gradients are still pushed, so the PS copy stays identical
and a victim is simply dropped).

With ``check_versions`` (``train.check_versions``), every row is checked against the PS's
version right before its batch trains (``cosparse.supply.versions``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np
import torch

from cosparse.config import TableConfig
from cosparse.ps import PSClient
from cosparse.store.device_cache import DeviceCache
from cosparse.store.resident import SlabRows, initial_rows
from cosparse.store.sources import RemoteSource
from cosparse.store.types import BatchPlan, DeliveredRowSource, RowSource
from cosparse.supply.versions import check_row_versions


class PSRows:
    """What both PS placements share: reads that create nothing, checkpoints through the PS."""

    client: PSClient
    cfg: TableConfig
    device: torch.device
    width: int
    rows_on_ps = ps_backed = True

    def read_rows(self, unique: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(self.client.pull(self.cfg.remote_name, unique, peek=True).rows).to(
            self.device
        )

    def initial_rows(self, ids: np.ndarray) -> np.ndarray:
        return initial_rows(self.cfg, self.width, ids)

    def export(self) -> dict[str, np.ndarray]:
        ids, rows = self.client.dump(self.cfg.remote_name)
        return {"ids": ids, "rows": rows}

    def _push_rows(self, state: dict[str, np.ndarray]) -> None:
        ids, rows = state["ids"], state["rows"]
        if ids.shape[0]:
            self.client.push_rows(self.cfg.remote_name, ids, np.ascontiguousarray(rows, np.float32))


class PSDirectTable(PSRows, SlabRows):
    """One table served by the PS; the trainer keeps only the rows of the batches in flight."""

    pins_rows = True  # batches in flight are bounded: their rows are deferred, not pinned

    def __init__(
        self, cfg: TableConfig, device: torch.device, client: PSClient, lookahead: int
    ) -> None:
        self._init_layout(cfg, device)
        self.client = client
        self.lookahead = lookahead
        self._recent: deque[np.ndarray] = deque(maxlen=max(lookahead, 1))
        # per planned batch: unique IDs, their rows and the versions they were read at, and the
        # positions deferred to the gather
        self._planned: deque[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = deque()
        self._training: np.ndarray | None = None  # IDs of the batch between gather and push
        self._grads: np.ndarray | None = None
        self.pulled_rows = 0
        self.deferred_rows = 0
        self.late_fill_ms = 0.0  # deferred pulls, made at the gather
        self.check_versions = False  # debug: check every row against the PS before it trains

    # --- planning and training ------------------------------------------------------------------
    def plan(self, unique: np.ndarray, seq: int, shrink: Callable[[], bool] | None = None
             ) -> BatchPlan:
        """The rows of ``unique`` that no batch still in flight will update are the misses to
        pull now; the others are deferred to the gather."""
        if self.lookahead and self._recent:
            deferred = np.isin(unique, np.concatenate(list(self._recent)))
        else:
            deferred = np.zeros(unique.shape[0], dtype=np.bool_)
        if self.lookahead:
            self._recent.append(unique)
        slots = np.arange(unique.shape[0], dtype=np.int64)
        now = np.flatnonzero(~deferred)
        rows = np.empty((unique.shape[0], self.dim), dtype=np.float32)
        versions = np.full(unique.shape[0], -1, dtype=np.int64)
        self._planned.append((unique, rows, versions, np.flatnonzero(deferred)))
        return BatchPlan(slots, deferred, unique[now], now, 0, seq)

    def row_sources(self, delivered: DeliveredRowSource | None = None) -> list[RowSource]:
        return []  # the PS is pulled directly: rows live in the batch's buffer, not a tier

    def fill(self, plan: BatchPlan, sources: list[RowSource]) -> None:
        _, rows, versions, _ = self._planned[-1]
        self._pull(plan.miss_ids, plan.miss_slots, rows, versions)

    def _pull(self, ids: np.ndarray, at: np.ndarray, rows: np.ndarray, versions: np.ndarray
              ) -> None:
        if ids.shape[0]:
            got = self.client.pull(self.cfg.remote_name, ids)
            rows[at], versions[at] = got.rows, got.versions
        self.pulled_rows += int(ids.shape[0])

    def gather(self, slots: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows of the next batch to train (pulled at planning, or now if they were deferred)."""
        unique, rows, versions, deferred = self._planned.popleft()
        if deferred.shape[0]:  # every earlier push has completed by now
            t0 = time.perf_counter()
            self._pull(unique[deferred], deferred, rows, versions)
            self.deferred_rows += int(deferred.shape[0])
            self.late_fill_ms += (time.perf_counter() - t0) * 1e3
        if self.check_versions:
            check_row_versions(self.client, self.cfg.remote_name, unique, versions)
        self._training = unique
        w = torch.from_numpy(rows).to(self.device)
        return w, torch.empty(rows.shape[0], 0, device=self.device)

    def apply_gradients(
        self, w: torch.Tensor, s: torch.Tensor, g: torch.Tensor, slots: np.ndarray, step: int
    ) -> None:
        """Nothing to update here: the shards run the optimizer on the pushed gradients."""
        self._grads = np.ascontiguousarray(g.detach().cpu().numpy(), dtype=np.float32)

    def write_back(self, step: int) -> None:
        """Push the row gradients; the shards apply the optimizer (the same kernels)."""
        if self._training is None or self._grads is None:
            return
        self.client.push(self.cfg.remote_name, self._training, self._grads, step)
        self._training = self._grads = None

    def release_all(self) -> None:
        """Forget batches planned but never trained (the run stopped)."""
        self._planned.clear()
        self._recent.clear()
        self._training = self._grads = None

    def load(self, state: dict[str, np.ndarray]) -> None:
        self._push_rows(state)


class PSCachedTable(PSRows, DeviceCache):
    """Architecture A with a write-through device cache of hot rows (see the module docstring).

    On CUDA, where the device kernel may round differently, the updated rows themselves are
    pushed instead of the gradients."""

    write_through = True

    def __init__(
        self, cfg: TableConfig, device: torch.device, client: PSClient, cache_rows: int,
        policy: str = "hotness", decay: float = 0.99,
    ) -> None:
        self._init_cache(cfg, device, cache_rows, policy, decay)
        self.client = client
        self._ids_of: dict[int, np.ndarray] = {}
        self._order: deque[int] = deque()
        self._training: tuple[np.ndarray, np.ndarray] | None = None
        self._grads: np.ndarray | None = None
        # per device slot: the PS version of the cached copy (read at the miss, plus the writes
        # this trainer made through it since), for ``check_versions``
        self.versions = np.full(cache_rows, -1, dtype=np.int64)
        self.check_versions = False

    def row_sources(self, delivered: DeliveredRowSource | None = None) -> list[RowSource]:
        # rows of batches in flight are cached and pinned, so a miss is never being updated
        return [RemoteSource(self.client, self.cfg.remote_name, self.counters, clean=True,
                             versions=self.versions)]

    def _evict(self, victims: np.ndarray, seq: int) -> None:
        """Written through: the PS holds these rows, a victim is dropped."""
        self.dev.remove(victims)
        self.counters.evictions_device += victims.shape[0]

    def fill(self, plan: BatchPlan, sources: list[RowSource]) -> None:
        DeviceCache.fill(self, plan, sources)
        self._ids_of[plan.seq] = np.asarray(self.dev.slot_ids[plan.slots])
        self._order.append(plan.seq)

    def gather(self, slots: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        ids = self._ids_of.pop(self._order.popleft())
        if self.check_versions:
            check_row_versions(self.client, self.cfg.remote_name, ids, self.versions[slots])
        self._training = (ids, slots)
        return SlabRows.gather(self, slots)

    def apply_gradients(
        self, w: torch.Tensor, s: torch.Tensor, g: torch.Tensor, slots: np.ndarray, step: int
    ) -> None:
        """Update the cached rows in place (the write-through follows in ``write_back``)."""
        SlabRows.apply_gradients(self, w, s, g, slots, step)
        if self.dev.slab_np is not None:  # same kernel on both sides: push the gradients
            self._grads = np.ascontiguousarray(g.detach().cpu().numpy(), dtype=np.float32)

    def write_back(self, step: int) -> None:
        """Write the update through to the PS: the gradients, or the updated rows on CUDA."""
        if self._training is None:
            return
        ids, slots = self._training
        if self._grads is not None:
            self.client.push(self.cfg.remote_name, ids, self._grads, step)
        else:
            self.client.push_rows(self.cfg.remote_name, ids, self.dev.read(slots))
        self.versions[slots] += 1  # the shards bump a row's version once per write
        self._training = self._grads = None

    def release_all(self) -> None:
        DeviceCache.release_all(self)
        self._ids_of.clear()
        self._order.clear()
        self._training = self._grads = None

    def drop_local_rows(self) -> None:
        self.release_all()
        self.dev.remove(self.dev.occupied_slots())

    def load(self, state: dict[str, np.ndarray]) -> None:
        self.dev.remove(self.dev.occupied_slots())
        self.dev.pins[:] = 0
        self.versions[:] = -1
        self.release_all()
        self._push_rows(state)

