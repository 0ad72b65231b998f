"""StreamReader: the batches of the files arriving in a watched directory (``data.stream``).

One endless epoch: the files ``DirWatch`` hands over (complete, in arrival order) are read one
after another, each by the reader of its format (``open_file``: csv or parquet, with
``data.columns``), in batches that never span two files; batch indices count on across files.
While nothing is ready the task source yields ``NOT_YET`` (the ``BatchStream`` delivers what it
has and asks again) and beats ``heartbeat``, so an idle stream is a live one, never a stall. It
ends when nothing new is complete for ``idle_timeout_s`` (None: never).

Every task's *position* is recorded in the main process: the file, its mtime, and the rows and
batches of it done once that batch has trained. The trainer takes the position of each batch it
trains (``position_after``) into its checkpoint; ``resume`` continues after it: the rest of that
file, then the files after it in arrival order. Tasks carry the file's path, so a data worker
process opens the file itself (``build``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosparse.batch import SparseBatch
from cosparse.config import StreamConfig
from cosparse.data.errors import DataError
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
        state.update(heartbeat=None, log=None, _positions=deque(), _cache=None)
        return state

    @property
    def num_batches(self) -> int:
        """Unknown for a stream: 0."""
        return 0

    def _reader(self, path: str) -> Reader:
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
        order): the file's name and mtime, and the rows and batches of it done."""
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
            pending = [(a, 0) for a in self._initial]
            after = self._initial[-1]
        else:  # the rest of the file of the last batch trained, then the files after it
            after = Arrival(int(pos["mtime_ns"]), str(pos["file"]))
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
        """The tasks of one file from its batch ``skip`` on, recording each one's position."""
        path = str(directory / arrival.name)
        reader = self._reader(path)
        if list(reader.keys) != self.keys or reader.num_dense != self.num_dense:
            raise DataError(f"{path}: its columns give the features {', '.join(reader.keys)} "
                            f"({reader.num_dense} dense); the stream's first file "
                            f"{self.first_file} gave {', '.join(self.keys)} ({self.num_dense} "
                            "dense): every file of a stream has the same columns")
        rows = _rows(reader)
        n = reader.num_batches
        self.log(f"data.stream: training {path} ({rows if rows is not None else '?'} rows, "
                 f"{n - skip} batches{f' after the {skip} done' if skip else ''})")
        for k, inner in enumerate(reader.tasks(skip), start=skip):
            done = (k + 1) * self.batch_size
            self._positions.append((index, {
                "file": arrival.name, "mtime_ns": arrival.mtime_ns,
                "rows": min(done, rows) if rows is not None else done, "batches": k + 1}))
            yield StreamTask(path, inner, index)
            index += 1
