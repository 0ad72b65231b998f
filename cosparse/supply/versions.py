"""The stale-read check of architecture A (``train.check_versions``, a debug mode).

Every PS row carries a version that its shard bumps on each write. A trainer copy of a row (a
prefetched pull, a deferred pull, a row in the device cache) remembers the version it was read at
(plus the writes the trainer itself made to it since). Right before a batch trains, the check
asks the shards for the current version of every row the batch uses (a PEEK, which creates
nothing) and raises ``StaleRowError`` when any copy differs from the PS's: the invariant that no
copy older than the last write-back is ever used, checked on every row of every step.
"""

from __future__ import annotations

import numpy as np

from cosparse.ps.client import PSClient


class StaleRowError(RuntimeError):
    """A row about to train is not the PS's latest version."""

    def __init__(self, table: str, ids: np.ndarray, used: np.ndarray, ps: np.ndarray) -> None:
        self.table = table
        self.id, self.used_version, self.ps_version = int(ids[0]), int(used[0]), int(ps[0])
        self.count = int(ids.shape[0])
        super().__init__(
            f"table '{table}': {self.count} row(s) about to train are not the PS's current "
            f"version, e.g. ID {self.id}: used version {self.used_version}, the PS holds "
            f"version {self.ps_version} (a copy read before a write landed, or a row written "
            "behind this trainer's back; found by train.check_versions)"
        )


def check_row_versions(client: PSClient, table: str, ids: np.ndarray, used: np.ndarray) -> None:
    """Raise ``StaleRowError`` unless the PS holds exactly version ``used[i]`` of ``ids[i]``."""
    if ids.shape[0] == 0:
        return
    ps = client.pull(table, ids, peek=True).versions
    bad = np.flatnonzero(ps != used)
    if bad.shape[0]:
        raise StaleRowError(table, ids[bad], used[bad], ps[bad])
