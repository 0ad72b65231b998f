"""Stall detection: tell a side that is slow from one that is stuck.

Each thread that others wait for keeps a ``Progress``: a beat counter and what it is doing. A
waiter polls the other side's ``Progress`` and raises ``StallError`` only when the other side has
not beaten for ``timeout_s`` (``train.stall_timeout_s``), so a long checkpoint or evaluation that
keeps beating is progress, never a stall. The error names both sides and what each was doing.

Written by hand: it is twenty lines over ``time.monotonic``, and no library offers the
"waiter names the stuck peer" shape the engine needs on every bounded wait.
"""

from __future__ import annotations

import threading
import time


class StallError(RuntimeError):
    """A wait whose other side made no progress for the stall timeout."""


class Progress:
    """One thread's progress, read by the threads that wait for it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.what = "starting"
        self.beats = 0
        self.at = time.monotonic()
        self._lock = threading.Lock()

    def beat(self, what: str | None = None) -> None:
        with self._lock:
            self.beats += 1
            self.at = time.monotonic()
            if what is not None:
                self.what = what

    def check(self, waiter: str, waiting_for: str, since: float, timeout_s: float) -> None:
        """Raise ``StallError`` when this side has not beaten for ``timeout_s`` during a wait that
        began at ``since`` (``time.monotonic()``): a side is judged only on its silence while
        someone waits for it, not on time it spent waiting for the waiter."""
        now = time.monotonic()
        silent = now - max(self.at, since)
        if timeout_s > 0 and silent >= timeout_s:
            raise StallError(
                f"stall: {waiter} waited {now - since:.1f} s for {self.name} ({waiting_for}); "
                f"{self.name} made no progress for {silent:.1f} s (last: {self.what}). "
                f"Raise train.stall_timeout_s ({timeout_s:g} s) if this wait is legitimately slow"
            )
