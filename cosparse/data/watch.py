"""Which files of a watched directory are new and complete (``data.stream``).

A file is *complete* once its size and mtime are the same on two listings at least ``poll_s``
apart: a writer that writes a file in place must not pause longer than that. The safe way is
to write under a name the pattern does not match (``part.parquet.tmp``, or a hidden
``.part.parquet``: hidden and ``.tmp`` names are never taken) and rename it when done; the file
is then taken at the next poll after it is stable. Files are taken in arrival order: by mtime,
then by name. The watch keeps a watermark, the (mtime, name) of the last file taken: only
files after it are new, which is also how a resumed stream knows the files it has finished. A
file that appears with an mtime before the watermark (copied with its old mtime kept) arrived
too late for that order: it is reported once and not taken (touch it to give it a new mtime).
A file taken that changes later (rows appended: a new mtime) is handed over again; the stream
then trains only what was appended, or refuses a file rewritten (``cosparse.data.follow``).
"""

from __future__ import annotations

import fnmatch
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cosparse.data.errors import DataError


@dataclass(frozen=True, order=True)
class Arrival:
    """A complete file, ordered by (mtime, name)."""

    mtime_ns: int
    name: str


class DirWatch:
    """Lists ``directory`` at most every ``poll_s`` and hands over the files of ``pattern``
    that became complete since, after the watermark ``after``, oldest first."""

    def __init__(self, directory: str | Path, pattern: str, poll_s: float,
                 after: Arrival | None = None,
                 warn: Callable[[str], None] | None = None) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise DataError(f"data.stream.watch: {self.directory} is not a directory")
        self.pattern = pattern
        self.poll_s = poll_s
        self.watermark = after
        self.warn = warn or (lambda msg: None)
        self._stats: dict[str, tuple[int, int]] | None = None  # name -> (size, mtime_ns)
        self._listed_at = -float("inf")
        self._late: set[str] = set()  # (reported once)

    def _list(self) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        try:
            entries = list(os.scandir(self.directory))
        except OSError as e:
            raise DataError(f"data.stream.watch: cannot list {self.directory} ({e})") from e
        for e in entries:
            name = e.name
            if name.startswith(".") or name.endswith(".tmp"):
                continue
            if not fnmatch.fnmatchcase(name, self.pattern):
                continue
            try:
                st = e.stat()
            except FileNotFoundError:  # renamed or removed meanwhile
                continue
            if e.is_file():
                out[name] = (st.st_size, st.st_mtime_ns)
        return out

    def poll(self) -> list[Arrival]:
        """The files complete since the last poll, oldest first ([] when the last listing is
        less than ``poll_s`` old)."""
        now = time.monotonic()
        if now - self._listed_at < self.poll_s:
            return []
        self._listed_at = now
        stats, before = self._list(), self._stats
        self._stats = stats
        if before is None:  # the first listing: nothing is known stable yet
            return []
        ready = sorted(Arrival(st[1], name) for name, st in stats.items()
                       if before.get(name) == st)
        wm = self.watermark
        if wm is not None:
            late = [n for n, st in stats.items() if n not in before and n not in self._late
                    and Arrival(st[1], n) < wm]
            for n in late:
                self._late.add(n)
                self.warn(f"data.stream: {self.directory / n} arrived with an mtime before the "
                          f"last file taken ({wm.name}); it is not trained (files are taken in "
                          "mtime order: touch it to give it a new mtime)")
            ready = [a for a in ready if a > wm]
        if ready:
            self.watermark = ready[-1]
        return ready
