"""FixedVocabTable: an all-resident table whose IDs are already dense row numbers
(``tables[i].vocab: fixed``): the ID taken modulo ``hash_size`` is the row's slot.

There is no ID map to look up or insert into, and every one of the ``hash_size`` rows is created
at start-up, from the same pure function of (table seed, ID) that a dynamic table uses when an ID
first appears, so the two train the same numbers bit for bit. A checkpoint holds the rows a batch
has touched (as a dynamic table's holds the IDs it has seen), so the two load each other's.
"""

from __future__ import annotations

import numpy as np
import torch

from cosparse.config import TableConfig
from cosparse.store.resident import BudgetExceeded, ResidentTable
from cosparse.waits import CountedLock


class FixedVocabTable(ResidentTable):
    """All ``hash_size`` rows of a table on one device, row ``k`` at slot ``k``."""

    def __init__(self, cfg: TableConfig, device: torch.device, max_bytes: int | None = None
                 ) -> None:
        if cfg.hash_size is None:
            raise ValueError(f"table '{cfg.name}': vocab 'fixed' needs hash_size")
        rows = int(cfg.hash_size)
        if max_bytes is not None and rows * 4 * self._width_of(cfg) > max_bytes:
            raise BudgetExceeded(
                f"table '{cfg.name}' has vocab 'fixed' with hash_size {rows} rows "
                f"({rows * 4 * self._width_of(cfg)} bytes) but its share of "
                f"store.device.budget_bytes is {max_bytes} bytes")
        self._init_layout(cfg, device)
        self.max_bytes = max_bytes
        self._ids_lock = CountedLock("lock.ids")
        self.touched = np.zeros(rows, dtype=bool)  # rows a batch has trained (a checkpoint's)
        self._touched_count = 0
        self._slab_np: np.ndarray | None = None
        self._spare = None
        self.slab = self._alloc(rows)
        self._init_all()

    @staticmethod
    def _width_of(cfg: TableConfig) -> int:
        from cosparse.optim import state_width

        return cfg.dim + state_width(cfg.optimizer.kind, cfg.dim)

    def _init_all(self) -> None:
        """Every row at its initial value (start-up, and under a checkpoint's rows)."""
        rows = self.capacity
        ids = np.arange(rows, dtype=np.int64)
        if self._slab_np is not None:
            self.initial_rows(ids, out=self._slab_np)
        else:
            self.slab[:] = torch.from_numpy(self.initial_rows(ids)).to(self.device)

    @property
    def num_rows(self) -> int:
        return self._touched_count

    def slots_for(self, unique: np.ndarray) -> np.ndarray:
        """The slot of row key ``k`` is ``k``: nothing is looked up and nothing created."""
        slots = np.ascontiguousarray(unique, dtype=np.int64)
        if slots.shape[0] and (slots.min() < 0 or slots.max() >= self.capacity):
            bad = slots[(slots < 0) | (slots >= self.capacity)][0]
            raise ValueError(f"table '{self.cfg.name}': row key {bad} is outside 0 .. "
                             f"{self.capacity - 1} (vocab 'fixed', hash_size {self.capacity})")
        with self._ids_lock:
            fresh = ~self.touched[slots]
            if fresh.any():
                self.touched[slots[fresh]] = True
                self._touched_count += int(fresh.sum())
        return slots

    def read_rows(self, unique: np.ndarray) -> torch.Tensor:
        """Rows of ``unique`` (an untouched row holds its initial value already)."""
        slots = torch.from_numpy(np.ascontiguousarray(unique, dtype=np.int64)).to(self.device)
        with self._slab_lock:
            return self.slab[slots, : self.dim].clone()

    def export(self) -> dict[str, np.ndarray]:
        """The touched rows, by ID."""
        with self._ids_lock:
            ids = np.flatnonzero(self.touched).astype(np.int64)
            with self._slab_lock:
                rows = self.slab[torch.from_numpy(ids).to(self.device)].cpu().numpy()
        return {"ids": ids, "rows": rows}

    def load(self, state: dict[str, np.ndarray]) -> None:
        ids, rows = np.asarray(state["ids"], dtype=np.int64), state["rows"]
        if rows.shape[1] != self.width:
            raise ValueError(
                f"table '{self.cfg.name}': checkpoint rows have width {rows.shape[1]}, "
                f"config needs {self.width} (dim + optimizer state)")
        if ids.shape[0] and (ids.min() < 0 or ids.max() >= self.capacity):
            raise ValueError(f"table '{self.cfg.name}': the checkpoint holds row keys outside "
                             f"0 .. {self.capacity - 1} (vocab 'fixed', hash_size "
                             f"{self.capacity}): was it written with another hash_size?")
        with self._ids_lock:
            self._init_all()
            self.slab[torch.from_numpy(ids).to(self.device)] = torch.from_numpy(rows).to(
                self.device)
            self.touched[:] = False
            self.touched[ids] = True
            self._touched_count = int(ids.shape[0])
