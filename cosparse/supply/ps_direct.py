"""PSDirectTable: architecture A. Rows live on the remote parameter server; each batch the trainer
pulls the unique rows it needs (one batched request per shard, all shards in parallel), trains,
and pushes the row gradients back, and the shards apply the same optimizer kernels.

Prefetch stays exact by ordering. Batch p is planned (its rows pulled) while up to ``lookahead``
earlier batches may still be training; rows that one of those batches will update are not pulled
then, but right before batch p trains, when every earlier push has completed. Which IDs are
deferred depends only on the data, so the bytes moved are deterministic too.

With ``check_versions`` (``train.check_versions``), every row is checked against the PS's
version right before its batch trains (``cosparse.supply.versions``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

import numpy as np
import torch

from cosparse.config import TableConfig
from cosparse.ps.client import PSClient
from cosparse.store.resident import SlabRows
from cosparse.supply.versions import check_row_versions


class PSDirectTable(SlabRows):
    """One table served by the PS; the trainer keeps only the rows of the batches in flight."""

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
        self.pulled_rows = 0
        self.deferred_rows = 0
        self.check_versions = False  # debug: check every row against the PS before it trains

    def map_ids(self, ids: np.ndarray) -> np.ndarray:
        if self.cfg.hash_size is not None:
            return np.remainder(ids, self.cfg.hash_size)
        return ids

    # --- planning and training ------------------------------------------------------------------
    def plan(self, unique: np.ndarray, seq: int, shrink: Callable[[], bool] | None = None,
             delivered: object = None) -> np.ndarray:
        """Pull the rows of ``unique`` that no batch still in flight will update."""
        if self.lookahead and self._recent:
            deferred = np.isin(unique, np.concatenate(list(self._recent)))
        else:
            deferred = np.zeros(unique.shape[0], dtype=np.bool_)
        rows = np.empty((unique.shape[0], self.dim), dtype=np.float32)
        versions = np.full(unique.shape[0], -1, dtype=np.int64)
        now = ~deferred
        if now.any():
            got = self.client.pull(self.cfg.name, unique[now])
            rows[now], versions[now] = got.rows, got.versions
        self.pulled_rows += int(now.sum())
        self.deferred_rows += int(deferred.sum())
        if self.lookahead:
            self._recent.append(unique)
        self._planned.append((unique, rows, versions, np.flatnonzero(deferred)))
        return np.arange(unique.shape[0], dtype=np.int64)

    def gather(self, slots: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows of the next batch to train (pulled at planning, or now if they were deferred)."""
        unique, rows, versions, deferred = self._planned.popleft()
        if deferred.shape[0]:  # every earlier push has completed by now
            got = self.client.pull(self.cfg.name, unique[deferred])
            rows[deferred], versions[deferred] = got.rows, got.versions
            self.pulled_rows += int(deferred.shape[0])
        if self.check_versions:
            check_row_versions(self.client, self.cfg.name, unique, versions)
        self._training = unique
        w = torch.from_numpy(rows).to(self.device)
        return w, torch.empty(rows.shape[0], 0, device=self.device)

    def apply_gradients(
        self, w: torch.Tensor, s: torch.Tensor, g: torch.Tensor, slots: np.ndarray, step: int
    ) -> None:
        """Push the row gradients; the shards apply the optimizer (the same kernels)."""
        assert self._training is not None
        grads = np.ascontiguousarray(g.detach().cpu().numpy(), dtype=np.float32)
        self.client.push(self.cfg.name, self._training, grads, step)
        self._training = None

    def release_all(self) -> None:
        """Forget batches planned but never trained (the run stopped)."""
        self._planned.clear()
        self._recent.clear()
        self._training = None

    # --- reads that change nothing, checkpoints ---------------------------------------------------
    def read_rows(self, unique: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(self.client.pull(self.cfg.name, unique, peek=True).rows).to(
            self.device
        )

    def initial_rows(self, ids: np.ndarray) -> np.ndarray:
        from cosparse.store.resident import initial_rows

        return initial_rows(self.cfg, self.width, ids)

    def export(self) -> dict[str, np.ndarray]:
        ids, rows = self.client.dump(self.cfg.name)
        return {"ids": ids, "rows": rows}

    def load(self, state: dict[str, np.ndarray]) -> None:
        ids, rows = state["ids"], state["rows"]
        if ids.shape[0]:
            self.client.push_rows(self.cfg.name, ids, np.ascontiguousarray(rows, np.float32))


class PSCachedTable(SlabRows):
    """Architecture A with a device cache of hot rows, written through.

    Every row a batch uses is made resident in a bounded device tier (rows and optimizer state,
    pulled from the PS on a miss) and pinned for the lookahead window, exactly like the tiered
    store. The optimizer updates cached rows in place with the same kernel and the gradients are
    still pushed, so the PS copy stays identical and a victim is simply dropped: nothing is ever
    written back. (On CUDA, where the device kernel may round differently, the updated rows
    themselves are pushed.)
    """

    def __init__(
        self, cfg: TableConfig, device: torch.device, client: PSClient, cache_rows: int,
        policy: str = "hotness", decay: float = 0.99,
    ) -> None:
        from cosparse.store.tier import Tier
        from cosparse.store.types import TableCounters

        self._init_layout(cfg, device)
        self.client = client
        self.dev = Tier("device", cache_rows, self.width, device, policy, decay)
        self.counters = TableCounters()
        self._pinned: dict[int, np.ndarray] = {}
        self._ids_of: dict[int, np.ndarray] = {}
        self._order: deque[int] = deque()
        self._training: tuple[np.ndarray, np.ndarray] | None = None
        # per device slot: the PS version of the cached copy (read at the miss, plus the writes
        # this trainer made through it since), for ``check_versions``
        self.versions = np.full(cache_rows, -1, dtype=np.int64)
        self.check_versions = False

    map_ids = PSDirectTable.map_ids

    @property
    def slab_array(self) -> np.ndarray | None:
        return self.dev.slab_np

    @property
    def slab(self) -> torch.Tensor:
        return self.dev.slab

    def plan(self, unique: np.ndarray, seq: int, shrink: Callable[[], bool],
             delivered: object = None) -> np.ndarray:
        from cosparse.store import kernels
        from cosparse.store.types import CapacityError

        dev, c = self.dev, self.counters
        slots = dev.lookup(unique)
        hit = slots >= 0
        kernels.add_pins(slots[hit], dev.pins, 1)
        miss = unique[~hit]
        c.lookups += unique.shape[0]
        c.device_hits += int(hit.sum())
        def drop(victims: np.ndarray) -> None:  # written through: the PS holds these rows
            dev.remove(victims)
            c.evictions_device += victims.shape[0]

        if not dev.make_room(miss.shape[0], seq, drop, shrink):
            kernels.add_pins(slots[hit], dev.pins, -1)
            raise CapacityError(
                f"table '{self.cfg.name}': the device cache holds {dev.capacity} rows but one "
                f"batch needs {unique.shape[0]} unique rows"
            )
        if miss.shape[0]:
            # rows of batches in flight are cached and pinned, so a miss is never being updated
            got = self.client.pull(self.cfg.name, miss, with_state=True)
            rows = got.rows
            c.backing_hits += miss.shape[0]  # every miss is a trainer pull
            c.bytes_backing_device += rows.nbytes
            new = dev.alloc(miss.shape[0])
            zeros = np.zeros(miss.shape[0], dtype=np.float32)
            dev.put(miss, new, rows, zeros, zeros.astype(np.int64), False)
            self.versions[new] = got.versions
            slots[~hit] = new
            kernels.add_pins(new, dev.pins, 1)
        dev.touch(slots, seq)
        self._pinned[seq] = slots
        self._ids_of[seq] = unique
        self._order.append(seq)
        return slots

    def gather(self, slots: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        seq = self._order.popleft()
        ids = self._ids_of.pop(seq)
        if self.check_versions:
            check_row_versions(self.client, self.cfg.name, ids, self.versions[slots])
        self._training = (ids, slots)
        return SlabRows.gather(self, slots)

    def apply_gradients(
        self, w: torch.Tensor, s: torch.Tensor, g: torch.Tensor, slots: np.ndarray, step: int
    ) -> None:
        """Update the cached rows in place and write the update through to the PS."""
        assert self._training is not None
        ids, _ = self._training
        SlabRows.apply_gradients(self, w, s, g, slots, step)
        if self.dev.slab_np is not None:  # same kernel on both sides: push the gradients
            grads = np.ascontiguousarray(g.detach().cpu().numpy(), dtype=np.float32)
            self.client.push(self.cfg.name, ids, grads, step)
        else:  # a device kernel may round differently: push the updated rows themselves
            self.client.push_rows(self.cfg.name, ids, self.dev.read(slots))
        self.versions[slots] += 1  # the shards bump a row's version once per write
        self._training = None

    def release(self, seq: int) -> None:
        from cosparse.store import kernels

        slots = self._pinned.pop(seq, None)
        if slots is not None:
            kernels.add_pins(slots, self.dev.pins, -1)

    def release_all(self) -> None:
        for seq in sorted(self._pinned):
            self.release(seq)
        self._ids_of.clear()
        self._order.clear()
        self._training = None

    def read_rows(self, unique: np.ndarray) -> torch.Tensor:
        return PSDirectTable.read_rows(self, unique)  # type: ignore[arg-type]

    def export(self) -> dict[str, np.ndarray]:
        return PSDirectTable.export(self)  # type: ignore[arg-type]

    def load(self, state: dict[str, np.ndarray]) -> None:
        self.dev.remove(self.dev.occupied_slots())
        self.dev.pins[:] = 0
        self.versions[:] = -1
        self.release_all()
        PSDirectTable.load(self, state)  # type: ignore[arg-type]


def enable_version_checks(tables: Iterable[object]) -> int:
    """Turn on the stale-read check (``train.check_versions``) for every PS-served table among
    ``tables``; returns how many there are."""
    n = 0
    for t in tables:
        if isinstance(t, PSDirectTable | PSCachedTable):
            t.check_versions = True
            n += 1
    return n
