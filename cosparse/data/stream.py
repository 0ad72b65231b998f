"""StreamReader: the batches of the files arriving in a watched directory (``data.stream``).

One endless epoch: the files ``DirWatch`` hands over (complete, in arrival order) are read one
after another, each by the reader of its format (``open_file``: csv or parquet, with
``data.columns``), in batches that never span two files; batch indices count on across files.
While nothing is ready the task source yields ``NOT_YET`` (the ``BatchStream`` delivers what it
has and asks again) and beats ``heartbeat``, so an idle stream is a live one, never a stall. It
ends when nothing new is complete for ``idle_timeout_s`` (None: never).

A CSV file is followed as it grows (``follow``): each time it is taken (again, with a new
mtime), only the whole lines past the byte offset consumed so far are trained, so rows appended
to a file are trained once, and a file truncated or rewritten below that offset is refused,
naming it. The tasks carry those lines' bytes, cut in the main process. A Parquet (or gzip)
file is read whole: taken again with the same bytes it is skipped, changed it is refused.

Every task's *position* is recorded in the main process: the file, its mtime, the rows and
batches of it done once that batch has trained, the byte offset (line files) and the
consumed marks of the files before it. The trainer takes the position of each batch it trains
(``position_after``) into its checkpoint; ``resume`` continues after it: the rest of that file,
then the files after it in arrival order, each followed from its mark. Tasks carry the file's
path, so a data worker process opens the file itself (``build``).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosparse.batch import SparseBatch
from cosparse.config import StreamConfig
from cosparse.data.errors import DataError
from cosparse.data.follow import (
    FileMark,
    check_prefix,
    complete_end,
    count_newlines,
    line_batches,
    prefix_digest,
    skip_lines,
)
from cosparse.data.lines import is_gzip
from cosparse.data.reader import NOT_YET, Reader
from cosparse.data.watch import Arrival, DirWatch


@dataclass(frozen=True)
class StreamTask:
    """Batch ``index`` of the stream: the task ``inner`` of the reader of ``path``."""

    path: str
    inner: Any
    index: int


def _rows(reader: Reader) -> int | None:
    """The rows of a file's reader, where it says."""
    n = getattr(reader, "num_rows", None)
    if n is None:
        n = getattr(getattr(reader, "source", None), "num_rows", None)
    return None if n is None else int(n)


class StreamReader:
    """A Reader over the files arriving in ``cfg.watch`` (see the module docstring). The first
    complete file fixes the features (``keys``, ``num_dense``): it is waited for here, up to
    ``first_wait_s`` (0: without bound), and every later file must give the same."""

    def __init__(self, cfg: StreamConfig, batch_size: int, open_file: Callable[[str], Reader],
                 first_wait_s: float = 0.0) -> None:
        self.cfg = cfg
        self.batch_size = batch_size
        self.open_file = open_file  # picklable: data workers open the files too
        self.heartbeat: Callable[[str], None] | None = None  # main process only
        self.log: Callable[[str], None] = lambda msg: None
        self._positions: deque[tuple[int, dict[str, Any]]] = deque()
        self._trained: dict[str, Any] | None = None  # the position of the last batch trained
        self._cache: tuple[str, Reader] | None = None
        self._marks: dict[str, FileMark] = {}  # how far each file taken was consumed
        watch = DirWatch(cfg.watch, cfg.pattern, cfg.poll_s)
        t0 = time.monotonic()
        while True:
            ready = watch.poll()
            if ready:
                break
            if first_wait_s and time.monotonic() - t0 >= first_wait_s:
                raise DataError(f"data.stream.watch: no complete file matching "
                                f"'{cfg.pattern}' arrived in {cfg.watch} within "
                                f"{first_wait_s:g} s (data.stream.idle_timeout_s, else "
                                "train.stall_timeout_s)")
            time.sleep(min(cfg.poll_s, 0.1))
        self._initial = ready  # the first tasks of a fresh stream (no wait for a second poll)
        first = self._reader(str(watch.directory / ready[0].name))
        self.first_file = ready[0].name
        self.keys: list[str] = list(first.keys)
        self.num_dense: int = first.num_dense

    def __getstate__(self) -> dict[str, Any]:
        """What a data worker needs: the config and how to open a file."""
        state = dict(self.__dict__)
        state.update(heartbeat=None, log=None, _positions=deque(), _cache=None,
                     _marks={})
        return state

    @property
    def num_batches(self) -> int:
        """Unknown for a stream: 0."""
        return 0

    def _reader(self, path: str) -> Reader:
        # (by path: a CSV file's tasks carry their lines, and its header and the prefix its types
        # were inferred from are checked unchanged before more of it is read; a file read whole
        # is never read again once changed)
        if self._cache is None or self._cache[0] != path:
            self._cache = (path, self.open_file(path))
        return self._cache[1]

    def build(self, task: StreamTask) -> SparseBatch:
        batch = self._reader(task.path).build(task.inner)
        batch.index = task.index
        return batch

    # --- positions ---------------------------------------------------------------------------
    def position_after(self, index: int) -> dict[str, Any]:
        """The position once batch ``index`` has trained (called for each batch trained, in
        order): the file's name and mtime, the rows and batches of it done, its byte offset
        and digest (a line file; else None) and the marks of the other files taken (``files``)."""
        while self._positions and self._positions[0][0] < index:
            self._positions.popleft()
        if not self._positions or self._positions[0][0] != index:
            raise RuntimeError(f"StreamReader: no position recorded for batch {index}")
        self._trained = self._positions.popleft()[1]
        return self._trained

    def resume(self, position: dict[str, Any] | None) -> None:
        """Continue after ``position`` (a checkpoint's): the next ``tasks`` start there."""
        self._trained = position

    # --- tasks -------------------------------------------------------------------------------
    def tasks(self, start_batch: int = 0) -> Iterator[Any]:
        """The tasks after the last batch trained (``resume``'s position, else the beginning),
        numbered from ``start_batch``, with ``NOT_YET`` while no file is ready."""
        cfg, index = self.cfg, start_batch
        self._positions.clear()
        pos = self._trained
        if pos is None:  # from the beginning: the files complete at start-up first
            self._marks = {}
            pending = [(a, 0) for a in self._initial]
            after = self._initial[-1]
        else:  # the rest of the file of the last batch trained, then the files after it
            self._marks = {n: FileMark.from_json(v) for n, v in pos.get("files", {}).items()}
            after = Arrival(int(pos["mtime_ns"]), str(pos["file"]))
            if pos.get("offset") is not None:  # a line file: on from its byte offset
                self._marks[after.name] = FileMark(int(pos["offset"]), int(pos["rows"]),
                                                   str(pos["digest"]))
                pending = [(after, 0)]
            else:  # a file read whole: the batches after those done
                self._marks.pop(after.name, None)
                pending = [(after, int(pos["batches"]))]
        watch = DirWatch(cfg.watch, cfg.pattern, cfg.poll_s, after, self.log)
        if not (watch.directory / after.name).is_file():  # (removed since: nothing left of it)
            pending = [p for p in pending if p[0] != after]
        idle_since = time.monotonic()
        while True:
            for arrival, skip in pending:
                for task in self._file_tasks(watch.directory, arrival, skip, index):
                    index += 1
                    yield task
                idle_since = time.monotonic()
            pending = [(a, 0) for a in watch.poll()]
            if pending:
                continue
            idle = time.monotonic() - idle_since
            if cfg.idle_timeout_s is not None and idle >= cfg.idle_timeout_s:
                self.log(f"data.stream: no new file in {cfg.watch} for {idle:.1f} s "
                         f"(data.stream.idle_timeout_s): the stream ends")
                return
            if self.heartbeat is not None:
                self.heartbeat(f"waiting for files matching '{cfg.pattern}' in {cfg.watch} "
                               f"(idle {idle:.0f} s)")
            yield NOT_YET

    def _file_tasks(self, directory: Path, arrival: Arrival, skip: int,
                    index: int) -> Iterator[StreamTask]:
        """The tasks of one file (taken for the first time, or again with a new mtime), from
        its batch ``skip`` (a file read whole) or its mark's offset (a line file) on, recording
        each one's position."""
        path = str(directory / arrival.name)
        mark = self._marks.get(arrival.name)
        if mark is not None:
            check_prefix(path, mark)
        reader = self._reader(path)
        if list(reader.keys) != self.keys or reader.num_dense != self.num_dense:
            raise DataError(f"{path}: its columns give the features {', '.join(reader.keys)} "
                            f"({reader.num_dense} dense); the stream's first file "
                            f"{self.first_file} gave {', '.join(self.keys)} ({self.num_dense} "
                            "dense): every file of a stream has the same columns")
        source = getattr(reader, "source", None)
        if getattr(source, "line_task", None) is not None and not is_gzip(path):
            yield from self._line_tasks(path, arrival, source, skip, index)
        else:
            yield from self._whole_tasks(path, arrival, reader, skip, index)

    def _line_tasks(self, path: str, arrival: Arrival, source: Any, skip: int,
                    index: int) -> Iterator[StreamTask]:
        """The tasks of a line file's whole lines past its mark (all of them, the header
        skipped, the first time; after ``skip`` batches, from a checkpoint without offsets)."""
        name, mark = arrival.name, self._marks.get(arrival.name)
        lo, rows = (mark.offset, mark.rows) if mark is not None else (0, 0)
        hi = complete_end(path, lo)
        if mark is None:
            lo = skip_lines(path, 0, hi, source.header_lines)
            if lo == 0 and source.header_lines:  # (the header is not complete yet)
                return
            if skip:
                done = skip_lines(path, lo, hi, skip * self.batch_size)
                lo, rows = done, count_newlines(path, lo, done)
        n = count_newlines(path, lo, hi)
        files = {k: m.to_json() for k, m in self._marks.items()}  # (the positions share it)
        if n:
            batches = -(-n // self.batch_size)
            self.log(f"data.stream: training {path} ({n} rows, {batches} batches)" if mark is None
                     else f"data.stream: training {path} rows {rows + 1}..{rows + n}: {n} rows "
                     f"appended since it was trained (bytes {lo:,}..{hi:,}, {batches} batches)")
        first_line = source.header_lines + rows + 1
        for k, (data, end) in enumerate(line_batches(path, lo, hi, self.batch_size)):
            num = data.count(b"\n")
            self._positions.append((index, {
                "file": name, "mtime_ns": arrival.mtime_ns, "rows": rows + num, "batches": k + 1,
                "offset": end, "digest": prefix_digest(path, end), "files": files}))
            yield StreamTask(path, source.line_task(first_line, num, data, k), index)
            index, rows, first_line = index + 1, rows + num, first_line + num
        self._marks[name] = FileMark(hi, rows, prefix_digest(path, hi))

    def _whole_tasks(self, path: str, arrival: Arrival, reader: Reader, skip: int,
                     index: int) -> Iterator[StreamTask]:
        """The tasks of a file read whole (Parquet, gzip) from its batch ``skip`` on; taken
        again, it is skipped when its bytes are the same and refused when they grew."""
        name, mark = arrival.name, self._marks.get(arrival.name)
        size = os.stat(path).st_size
        if mark is not None:
            if size == mark.offset:  # (check_prefix: the same bytes)
                self.log(f"data.stream: {path} has a new mtime but the same bytes: nothing new")
                return
            raise DataError(f"data.stream: {path} grew after it was trained ({mark.offset:,} -> "
                            f"{size:,} bytes), but a Parquet or gzip file is read whole: rows "
                            "cannot be appended to it (write them to a new file)")
        digest = prefix_digest(path, size)
        rows = _rows(reader)
        n = reader.num_batches
        self.log(f"data.stream: training {path} ({rows if rows is not None else '?'} rows, "
                 f"{n - skip} batches{f' after the {skip} done' if skip else ''})")
        files = {k: m.to_json() for k, m in self._marks.items()}
        done = 0
        for k, inner in enumerate(reader.tasks(skip), start=skip):
            done = (k + 1) * self.batch_size
            self._positions.append((index, {
                "file": name, "mtime_ns": arrival.mtime_ns,
                "rows": min(done, rows) if rows is not None else done, "batches": k + 1,
                "offset": None, "digest": None, "files": files}))
            yield StreamTask(path, inner, index)
            index += 1
        self._marks[name] = FileMark(size, rows if rows is not None else done, digest)
