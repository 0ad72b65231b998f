"""RemoteBatch: the remote PS beneath the tiers, whose requests during one plan, over every
table, go out together: one round trip for the rows that host tiers spill, one for the misses.

Planning a batch used to make two PS round trips per table (the host's spilled victims, then the
device misses nobody else held): 16 per step for 8 tables, each one a wake-up of the trainer's
planner thread and of every shard. Under CPU contention each wake-up waits for a core, so the
planner thread now hands the PS one batch per step (issue 18: one hand-off per batch, not per
table).

Between ``begin`` and ``flush`` (``CachePlanner.plan``):
- ``push_rows`` queues the rows (copies: the host has already let them go) and answers at once,
  telling ``on_queued``: under architecture B, a delivered copy of a row whose write-back is
  queued is stale, though the PS has not seen the write yet;
- ``pull_later`` queues the pull of a table's misses with what to do with the rows, and
  ``after`` what the table does once they are in (put them in its map and pin them: until then
  its misses' reserved slots are in no map, so no reader sees them half-filled).
``flush`` sends the pushes first, then the pulls, then runs the callbacks in the order given.
Outside a plan every call goes straight through.

A queued write-back is a row in flight: no tier holds it any more and the PS does not yet.
``pending`` shows it to readers on other threads (a checkpoint's export, an evaluation), and it
stays there until the PS has acknowledged it, so a reader that reads the tiers, then
``pending``, then the PS sees every row once at least.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from cosparse.store.types import RemoteRows


class RemoteBatch:
    """``remote`` (a PS client, or a client that logs its write-backs), batched per plan."""

    def __init__(self, remote: RemoteRows,
                 on_queued: Callable[[str, np.ndarray], None] | None = None) -> None:
        self.remote = remote
        self.on_queued = on_queued  # told of each queued write-back (B: its rows' copies go stale)
        self._open = False
        self._pushes: list[tuple[str, np.ndarray, np.ndarray]] = []
        self._pulls: list[tuple[str, np.ndarray, Callable[[Any], None]]] = []
        self._after: list[Callable[[], None]] = []

    @property
    def is_open(self) -> bool:
        return self._open

    def begin(self) -> None:
        self._open = True

    # --- the RemoteRows interface --------------------------------------------------------------
    def pull(self, table: str, ids: np.ndarray, with_state: bool = False, peek: bool = False
             ) -> Any:
        return self.remote.pull(table, ids, with_state=with_state, peek=peek)

    def push_rows(self, table: str, ids: np.ndarray, rows: np.ndarray) -> Any:
        if not self._open:
            return self.remote.push_rows(table, ids, rows)
        # copies: the slots they came from may take other rows before the flush
        self._pushes.append((table, np.array(ids, np.int64), np.array(rows, np.float32)))
        if self.on_queued is not None:
            self.on_queued(table, ids)
        return None

    def dump(self, table: str) -> tuple[np.ndarray, np.ndarray]:
        return self.remote.dump(table)

    # --- deferred pulls ------------------------------------------------------------------------
    def pull_later(self, table: str, ids: np.ndarray, on_rows: Callable[[Any], None]) -> bool:
        """Queue a pull (with optimizer state, creating unknown rows) whose result goes to
        ``on_rows`` at the flush; False outside a plan (the caller pulls now)."""
        if not self._open:
            return False
        self._pulls.append((table, ids, on_rows))
        return True

    def after(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` at the flush, once every queued pull is written."""
        self._after.append(fn)

    def pending(self, table: str) -> tuple[np.ndarray, np.ndarray] | None:
        """``table``'s queued write-backs that the PS has not acknowledged: (IDs, rows), the
        newest copy of each ID; None when there are none. Safe from another thread."""
        queued = [(ids, rows) for t, ids, rows in list(self._pushes) if t == table]
        if not queued:
            return None
        ids = np.concatenate([q[0] for q in queued])[::-1]
        rows = np.concatenate([q[1] for q in queued])[::-1]
        _, newest = np.unique(ids, return_index=True)
        return ids[newest], rows[newest]

    def flush(self) -> None:
        """Send what was queued (pushes, then pulls) and run the callbacks; closes the batch.
        The pushes stay ``pending`` until the PS has acknowledged them."""
        self._open = False
        pushes, pulls, after = self._pushes, self._pulls, self._after
        self._pulls, self._after = [], []
        if pushes:
            self.remote.push_rows_many(pushes)
            self._pushes = []  # (a new list: a reader holding the old one still sees them)
        if pulls:
            got = self.remote.pull_many([(t, ids) for t, ids, _ in pulls], with_state=True)
            for (_, _, on_rows), result in zip(pulls, got, strict=True):
                on_rows(result)
        for fn in after:
            fn()
