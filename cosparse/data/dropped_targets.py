"""What the interactions reader leaves out of a split, and why: a target event needs
``data.events.min_history`` earlier events of its user, and under ``data.events.ties: strict``
events at the same time are not each other's history. On a log of day-granular timestamps that
drops many targets and whole users; the start-up line says how many, how many of them only
because of ties, and how many of the split's users are left without a sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DroppedTargets:
    """The split's events that are no sample: ``targets`` in all, ``tie_only`` of them with
    enough earlier rows of their user but not at earlier times, and the split's ``users`` of
    whom ``users_lost`` have no sample at all."""

    targets: int = 0
    tie_only: int = 0
    users: int = 0
    users_lost: int = 0

    def describe(self, min_history: int) -> str:
        """The start-up line's tail ("" when nothing was dropped)."""
        if not self.targets:
            return ""
        line = (f"; {self.targets:,} target events dropped, with fewer than "
                f"data.events.min_history ({min_history}) earlier events of their user")
        if self.tie_only:
            line += (f" ({self.tie_only:,} of them only because those events have the same "
                     "time: data.events.ties: keep_file_order orders them by file row)")
        if self.users_lost:
            line += f"; {self.users_lost:,} of the split's {self.users:,} users have no sample"
        return line


def dropped_targets(user: np.ndarray, user_start: np.ndarray, in_split: np.ndarray,
                    enough: np.ndarray, min_history: int) -> DroppedTargets:
    """The events (sorted by user; ``user_start``: the first event of each one's user) of
    ``in_split`` that lack ``enough`` history, counted over whole arrays."""
    short = in_split & ~enough
    if not short.any():
        return DroppedTargets()
    rows_before = np.arange(len(user), dtype=np.int64) - user_start
    users = np.unique(user[in_split])
    kept = np.unique(user[in_split & enough])
    return DroppedTargets(int(short.sum()), int((short & (rows_before >= min_history)).sum()),
                          len(users), len(users) - len(kept))
