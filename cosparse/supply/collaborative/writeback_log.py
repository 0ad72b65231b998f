"""WriteBackLog: for each row the trainer wrote back to the PS, the owning shard's write counter
right after that write. A delivered copy pulled at a lower counter predates the write-back, so
it is stale (invariant 2: it is dropped and fetched again, never used)."""

from __future__ import annotations

import numpy as np

from cosparse.ps.client import PSClient
from cosparse.store.hashmap import IdMap


class WriteBackLog:
    """ID -> shard write counter of its last write-back, for one table."""

    def __init__(self) -> None:
        self._map = IdMap()
        self._counter = np.zeros(1024, dtype=np.int64)

    @property
    def size(self) -> int:
        return self._map.size

    def record(self, ids: np.ndarray, counters: np.ndarray) -> None:
        """Rows ``ids`` (unique) were written back; ``counters`` [n] per row."""
        slots, _ = self._map.lookup_or_insert(ids)
        if self._map.size > self._counter.shape[0]:
            grown = np.zeros(max(self._map.size, 2 * self._counter.shape[0]), dtype=np.int64)
            grown[: self._counter.shape[0]] = self._counter
            self._counter = grown
        self._counter[slots] = counters

    def last(self, ids: np.ndarray) -> np.ndarray:
        """Counter of each ID's last write-back, -1 for rows never written back."""
        slots = self._map.lookup(ids)
        out = np.full(ids.shape[0], -1, dtype=np.int64)
        hit = slots >= 0
        out[hit] = self._counter[slots[hit]]
        return out


class LoggedRemote:
    """The PS client as the tier below the host, recording every write-back in a log."""

    def __init__(self, client: PSClient) -> None:
        self.client = client
        self.logs: dict[str, WriteBackLog] = {}

    def log(self, table: str) -> WriteBackLog:
        if table not in self.logs:
            self.logs[table] = WriteBackLog()
        return self.logs[table]

    def pull(self, table: str, ids: np.ndarray, with_state: bool = False, peek: bool = False):
        return self.client.pull(table, ids, with_state=with_state, peek=peek)

    def write_pending(self, table: str, ids: np.ndarray) -> None:
        """Rows ``ids`` will be written back (queued): until the write's own counter replaces
        it, every copy of them delivered before is stale."""
        self.log(table).record(ids, np.full(ids.shape[0], np.iinfo(np.int64).max, np.int64))

    def pull_many(self, asks: list[tuple[str, np.ndarray]], with_state: bool = False,
                  peek: bool = False) -> list:
        return self.client.pull_many(asks, with_state=with_state, peek=peek)

    def push_rows(self, table: str, ids: np.ndarray, rows: np.ndarray) -> dict[int, int]:
        return self.push_rows_many([(table, ids, rows)])[0]

    def push_rows_many(self, writes: list[tuple[str, np.ndarray, np.ndarray]]
                       ) -> list[dict[int, int]]:
        """Several tables' write-backs in one round trip, each one logged."""
        afters = self.client.push_rows_many(writes)
        for (table, ids, _), after in zip(writes, afters, strict=True):
            counters = np.zeros(self.client.num_shards, dtype=np.int64)
            for shard, c in after.items():
                counters[shard] = c
            self.log(table).record(ids, counters[self.client.shard_of(ids)])
        return afters

    def dump(self, table: str) -> tuple[np.ndarray, np.ndarray]:
        return self.client.dump(table)
