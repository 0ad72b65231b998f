"""The trainer's resident set, published to the data workers through shared memory.

Per table, a blocked Bloom filter of the IDs held by the device and host tiers (``bits_per_row``
bits per row of tier capacity, ``k`` bits per ID, all in one 64-bit word). The filters live in
one file of 64-bit words under a shared-memory directory: an 8-word header, then each table's
words. The trainer writes under a sequence lock (the sequence word is odd while it writes); a
worker queries the mapped words directly and keeps the answer only when the sequence was even
and unchanged across its query. A stale or missing answer only costs bandwidth: the trainer
drops delivered rows it already holds and fetches rows the workers did not bring.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from cosparse.supply.collaborative import kernels

_MAGIC = 0xC05A_F11E_0000_0001
_HEADER = 8  # words: magic, seq, step, published_ns, k, n_tables, reserved x2
_SEQ, _STEP, _TIME = 1, 2, 3


@dataclass(frozen=True)
class FilterLayout:
    """Where each table's filter lives in the shared file (picklable, sent to the workers)."""

    path: str
    tables: tuple[str, ...]
    words: tuple[int, ...]  # filter size of each table, in 64-bit words
    k: int = 4

    @classmethod
    def sized(cls, path: str, capacity_rows: dict[str, int], bits_per_row: int, k: int = 4
              ) -> FilterLayout:
        if not 1 <= k <= 5:
            raise ValueError(f"resident filter: k = {k} bits per ID, must be 1 to 5 (one 64-bit "
                             "mix gives the word and the bits)")
        names = tuple(capacity_rows)
        words = tuple(max(8, (capacity_rows[n] * bits_per_row + 63) // 64) for n in names)
        if max(words, default=0) >= 1 << 32:
            raise ValueError(f"resident filter: {max(words)} words for one table, over 2**32")
        return cls(path, names, words, k)

    @property
    def total_words(self) -> int:
        return _HEADER + sum(self.words)

    def span(self, table: str) -> tuple[int, int]:
        i = self.tables.index(table)
        lo = _HEADER + sum(self.words[:i])
        return lo, lo + self.words[i]


class FilterBoard:
    """The trainer's side: creates the shared file and publishes whole filter sets."""

    def __init__(self, layout: FilterLayout) -> None:
        self.layout = layout
        with open(layout.path, "wb") as f:
            f.truncate(layout.total_words * 8)
        self._mem = np.memmap(layout.path, dtype=np.uint64, mode="r+", shape=(layout.total_words,))
        self._mem[0] = _MAGIC
        self._mem[4] = layout.k
        self._mem[5] = len(layout.tables)
        self.publishes = 0

    @property
    def seq(self) -> int:
        return int(self._mem[_SEQ])

    def publish(self, resident: dict[str, np.ndarray], step: int) -> None:
        """Replace every table's filter with one built from its resident IDs."""
        built = {}
        for name in self.layout.tables:
            lo, hi = self.layout.span(name)
            words = np.zeros(hi - lo, dtype=np.uint64)
            ids = resident.get(name)
            if ids is not None and ids.shape[0]:
                kernels.bloom_add(words, np.ascontiguousarray(ids, np.int64), self.layout.k)
            built[name] = words
        mem = self._mem
        mem[_SEQ] += np.uint64(1)  # odd: writing
        for name, words in built.items():
            lo, hi = self.layout.span(name)
            mem[lo:hi] = words
        mem[_STEP] = np.uint64(step)
        mem[_TIME] = np.uint64(time.time_ns())
        mem[_SEQ] += np.uint64(1)  # even: consistent
        self.publishes += 1

    def close(self) -> None:
        """Withdraw the filter (sequence 0: a worker still mapping it brings nothing from now
        on, the trainer fetches its own rows), then remove the file."""
        self._mem[_SEQ] = np.uint64(0)
        self._mem.flush()
        self._mem._mmap.close()  # type: ignore[attr-defined]
        try:
            os.unlink(self.layout.path)
        except FileNotFoundError:
            pass


class FilterView:
    """A worker's side: maps the file read-only and queries it."""

    def __init__(self, layout: FilterLayout) -> None:
        self.layout = layout
        self._mem = np.memmap(layout.path, dtype=np.uint64, mode="r", shape=(layout.total_words,))
        if int(self._mem[0]) != _MAGIC:
            raise ValueError(f"{layout.path}: not a cosparse resident filter")

    def resident(self, table: str, ids: np.ndarray, retries: int = 3) -> tuple[np.ndarray, int] | None:
        """(may-be-resident mask, filter sequence) for ``ids``; None when no consistent filter
        was published (the worker then brings nothing for this table)."""
        lo, hi = self.layout.span(table)
        out = np.empty(ids.shape[0], dtype=np.bool_)
        for _ in range(retries):
            s1 = int(self._mem[_SEQ])
            if s1 == 0 or s1 & 1:
                time.sleep(0.0005)
                continue
            kernels.bloom_contains(self._mem[lo:hi].view(np.ndarray), ids, self.layout.k, out)
            if int(self._mem[_SEQ]) == s1:
                return out, s1
        return None
