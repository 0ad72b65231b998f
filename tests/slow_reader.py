"""A reader whose build never finishes in time: a data worker stays busy in it (lifecycle tests)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path


class SlowReader:
    """``build`` writes the worker's pid to ``marker`` and then sleeps for ``build_s``."""

    keys = ["a"]
    num_dense = 0

    def __init__(self, marker: str, build_s: float = 60.0) -> None:
        self.marker = marker
        self.build_s = build_s

    def num_batches(self) -> int:
        return 4

    def tasks(self, start_batch: int = 0) -> Iterator[int]:
        yield from range(start_batch, 4)

    def build(self, task: int):
        Path(self.marker).write_text(str(os.getpid()))
        time.sleep(self.build_s)
        raise RuntimeError("a SlowReader build is not meant to finish")
