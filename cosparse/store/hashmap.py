"""IdMap: the dynamic vocabulary of one table, raw int64 ID -> row slot, with capacity growth."""

from __future__ import annotations

import numpy as np

from cosparse.store import kernels

_MAX_LOAD = 0.7


def _pow2_at_least(n: int) -> int:
    return 1 << max(4, int(n - 1).bit_length())


class IdMap:
    """Open-addressing (linear probing) map from unbounded 64-bit IDs to dense int32 slots.

    Slots are handed out in insertion order: 0, 1, 2, ... . Lookups and inserts are batched.
    """

    def __init__(self, expected: int = 1024) -> None:
        cap = _pow2_at_least(int(expected / _MAX_LOAD) + 1)
        self.keys = np.zeros(cap, dtype=np.int64)
        self.vals = np.full(cap, -1, dtype=np.int32)
        self.size = 0

    @property
    def capacity(self) -> int:
        return int(self.keys.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes of the map's arrays (its whole capacity, not only the live entries)."""
        return int(self.keys.nbytes + self.vals.nbytes)

    def reserve(self, extra: int) -> None:
        """Room for ``extra`` more entries within the load limit (rehashing into a larger map)."""
        need = self.size + extra
        if need <= _MAX_LOAD * self.capacity:
            return
        cap = _pow2_at_least(int(need / _MAX_LOAD) + 1)
        keys = np.zeros(cap, dtype=np.int64)
        vals = np.full(cap, -1, dtype=np.int32)
        kernels.map_rehash(self.keys, self.vals, keys, vals)
        self.keys, self.vals = keys, vals

    def lookup_or_insert(self, ids: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """Slots of ``ids`` (which must be unique); returns (slots, first_new_slot).

        IDs not yet present get new slots ``first_new_slot ..`` in the order they appear.
        """
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        self.reserve(ids.shape[0])
        slots = out if out is not None else np.empty(ids.shape[0], dtype=np.int64)
        first_new = self.size
        nxt = kernels.map_lookup_or_insert(self.keys, self.vals, ids, slots, self.size, 2**31 - 1)
        if nxt < 0:
            raise OverflowError("IdMap: more than 2**31-1 rows in one table")
        self.size = int(nxt)
        return slots, first_new

    def insert(self, ids: np.ndarray, slots: np.ndarray) -> None:
        """Insert absent, unique ``ids`` with the given ``slots``."""
        self.reserve(ids.shape[0])
        kernels.map_insert(self.keys, self.vals, np.ascontiguousarray(ids, dtype=np.int64), slots)
        self.size += int(ids.shape[0])

    def erase(self, ids: np.ndarray) -> int:
        """Remove ``ids`` (backward-shift deletion, no tombstones); returns how many were present."""
        n = int(kernels.map_erase(self.keys, self.vals, np.ascontiguousarray(ids, dtype=np.int64)))
        self.size -= n
        return n

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Slots of ``ids``, -1 where absent."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        out = np.empty(ids.shape[0], dtype=np.int64)
        kernels.map_lookup(self.keys, self.vals, ids, out)
        return out

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids, slots) of every entry, ordered by slot."""
        occupied = self.vals >= 0
        ids, slots = self.keys[occupied], self.vals[occupied].astype(np.int64)
        order = np.argsort(slots, kind="stable")
        return ids[order], slots[order]

    @classmethod
    def from_items(cls, ids: np.ndarray, slots: np.ndarray) -> IdMap:
        """Rebuild a map whose slots are exactly 0..n-1 (as ``items`` returns them)."""
        if not np.array_equal(slots, np.arange(slots.shape[0])):
            raise ValueError("IdMap.from_items: slots must be 0..n-1 in order")
        m = cls(expected=max(1024, ids.shape[0]))
        m.lookup_or_insert(ids)
        return m
