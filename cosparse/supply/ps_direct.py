"""PSDirectTable: architecture A. Rows live on the remote parameter server; each batch the trainer
pulls the unique rows it needs (one batched request per shard, all shards in parallel), trains,
and pushes the row gradients back, and the shards apply the same optimizer kernels.

Prefetch stays exact by ordering. Batch p is planned (its rows pulled) while up to ``lookahead``
earlier batches may still be training; rows that one of those batches will update are not pulled
then, but right before batch p trains, when every earlier push has completed. Which IDs are
deferred depends only on the data, so the bytes moved are deterministic too.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np
import torch

from cosparse.config import TableConfig
from cosparse.ps.client import PSClient
from cosparse.store.resident import SlabRows


class PSDirectTable(SlabRows):
    """One table served by the PS; the trainer keeps only the rows of the batches in flight."""

    def __init__(
        self, cfg: TableConfig, device: torch.device, client: PSClient, lookahead: int
    ) -> None:
        self._init_layout(cfg, device)
        self.client = client
        self.lookahead = lookahead
        self._recent: deque[np.ndarray] = deque(maxlen=max(lookahead, 1))
        self._planned: deque[tuple[np.ndarray, np.ndarray, np.ndarray]] = deque()
        self._training: np.ndarray | None = None  # IDs of the batch between gather and push
        self.pulled_rows = 0
        self.deferred_rows = 0

    def map_ids(self, ids: np.ndarray) -> np.ndarray:
        if self.cfg.hash_size is not None:
            return np.remainder(ids, self.cfg.hash_size)
        return ids

    # --- planning and training ------------------------------------------------------------------
    def plan(self, unique: np.ndarray, seq: int, shrink: Callable[[], bool] | None = None
             ) -> np.ndarray:
        """Pull the rows of ``unique`` that no batch still in flight will update."""
        if self.lookahead and self._recent:
            deferred = np.isin(unique, np.concatenate(list(self._recent)))
        else:
            deferred = np.zeros(unique.shape[0], dtype=np.bool_)
        rows = np.empty((unique.shape[0], self.dim), dtype=np.float32)
        now = ~deferred
        if now.any():
            rows[now] = self.client.pull(self.cfg.name, unique[now]).rows
        self.pulled_rows += int(now.sum())
        self.deferred_rows += int(deferred.sum())
        if self.lookahead:
            self._recent.append(unique)
        self._planned.append((unique, rows, np.flatnonzero(deferred)))
        return np.arange(unique.shape[0], dtype=np.int64)

    def gather(self, slots: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows of the next batch to train (pulled at planning, or now if they were deferred)."""
        unique, rows, deferred = self._planned.popleft()
        if deferred.shape[0]:  # every earlier push has completed by now
            rows[deferred] = self.client.pull(self.cfg.name, unique[deferred]).rows
            self.pulled_rows += int(deferred.shape[0])
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
