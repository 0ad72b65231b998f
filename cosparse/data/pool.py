"""BatchStream: build a reader's batches in worker processes, delivered in order.

``workers=0`` builds in-process. ``workers=N`` starts N OS processes (``forkserver`` or ``spawn``,
never ``fork``: torch and numba threads make fork unsafe). Task ``i`` goes to worker ``i % N`` and
its result is read back from worker ``i % N``, so the delivered sequence is the same whatever N is.
Every queue is bounded (``queue_depth``); batches travel as plain numpy arrays. A worker's exception
is re-raised in the main process with the same type and message. Workers are stopped on close(),
on exhaustion, on error, on garbage collection and at interpreter exit; when the main process
dies, however it dies, each worker ends at once (a thread waits on its parent sentinel) and so
does the fork server (``forkserver_guard``). multiprocessing's temporary directory carries the
main process's owner tag (``cosparse.owner``), so a run killed outright leaves nothing that the
next run does not sweep.

This module is the consumer side; the worker process is ``worker_loop``, starting and stopping
workers is ``processes``, the message format is ``codec``.
"""

from __future__ import annotations

import queue
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

from cosparse import waits
from cosparse.batch import SparseBatch
from cosparse.data.codec import BatchCodec, PlainCodec
from cosparse.data.processes import check_preload, shutdown, worker_context
from cosparse.data.reader import NOT_YET, Reader
from cosparse.data.worker_loop import RemoteTraceback, rebuild_error, worker_main
from cosparse.link import LinkShaper

# (re-exported: where these lived before the worker side got modules of its own)
__all__ = ["BatchCodec", "BatchStream", "PlainCodec", "RemoteTraceback", "WorkerExited"]

_POLL_S = 0.5  # how often a waiting main process checks that its worker is alive
_NOT_YET_S = 0.05  # how long a stream with nothing in flight waits before asking its source again


class WorkerExited(RuntimeError):
    """A data worker process died before returning its batch."""


class BatchStream:
    """Iterable of the reader's SparseBatches from ``start_batch`` on, built by ``workers`` processes.

    Counters: ``delivered`` (batches returned), ``bad_records`` (sum over delivered batches),
    ``wait_s`` / ``wait_ms`` (time the consumer spent waiting for batches: stage_ms.read).

    ``preload``: names of extra modules (dotted, e.g. ``"cosparse.features.preload"``) that the
    workers' fork server imports once before any fork, after data's own code and kernels
    (``cosparse.data.preload``), so that workers start warm with the code of the layers above:
    a feature extractor, a supply path's worker side. The data package names none of them
    itself. They take effect with the forkserver start method, when this stream starts the fork
    server (the first stream with workers in the process; later ones share it), so pass the same
    names to every stream of a run. A name the fork server cannot import is skipped (the workers
    then import that code themselves, cold). ``()`` (the default): data's own code only.
    """

    def __init__(
        self,
        reader: Reader,
        workers: int = 0,
        queue_depth: int = 4,
        start_batch: int = 0,
        start_method: str | None = None,
        codec: BatchCodec | None = None,
        link: LinkShaper | None = None,
        preload: Sequence[str] = (),
    ) -> None:
        if workers < 0:
            raise ValueError("workers must be >= 0")
        if queue_depth < 1:
            raise ValueError("queue_depth must be >= 1")
        self.reader = reader
        self.codec = codec or PlainCodec(reader)
        self.link = link  # the simulated worker->trainer link (None: unshaped)
        self.workers = workers
        self.queue_depth = queue_depth
        self.preload = check_preload(preload)
        self.start_batch = start_batch
        self.delivered = 0
        self.bad_records = 0
        self.wait_s = 0.0
        self._tasks: Iterator[Any] = iter(reader.tasks(start_batch))
        self._tasks_done = False
        self._task_error: BaseException | None = None
        self._submitted = 0
        self._received = 0
        self._closed = False
        self._procs: list[Any] = []
        self._in: list[Any] = []
        self._out: list[Any] = []
        self._graceful = [False]
        self._finalizer = weakref.finalize(
            self, shutdown, self._procs, self._in, self._out, self._graceful
        )
        if workers > 0:
            try:
                self._start(start_method)
            except BaseException:
                self.close()
                raise

    # --- lifecycle ---------------------------------------------------------------------------
    def _start(self, start_method: str | None) -> None:
        ctx = worker_context(start_method, self.preload)
        for i in range(self.workers):
            in_q = ctx.Queue(maxsize=self.queue_depth)
            out_q = ctx.Queue(maxsize=self.queue_depth)
            p = ctx.Process(
                target=worker_main, args=(self.codec, in_q, out_q),
                name=f"cosparse-data-{i}", daemon=True,
            )
            self._in.append(in_q)
            self._out.append(out_q)
            p.start()
            self._procs.append(p)
            # The main process only reads ``out_q``: drop its copy of the write end, so a reader
            # blocked on a worker that dies (even mid-message) gets EOF instead of waiting forever.
            out_q._writer.close()
        self._fill()

    @property
    def pids(self) -> list[int]:
        """Process ids of the running workers (empty after close)."""
        return [p.pid for p in self._procs if p.pid is not None]

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop the workers and release the task source. Safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()
        close = getattr(self._tasks, "close", None)
        if close is not None:
            try:
                close()
            except Exception:
                pass

    def __enter__(self) -> BatchStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if hasattr(self, "_finalizer"):
            self.close()

    # --- counters ------------------------------------------------------------------------------
    @property
    def wait_ms(self) -> float:
        return self.wait_s * 1e3

    def stats(self) -> dict[str, float]:
        return {"batches": self.delivered, "bad_records": self.bad_records, "read_ms": self.wait_ms}

    # --- iteration -----------------------------------------------------------------------------
    def __iter__(self) -> BatchStream:
        return self

    def _next_task(self) -> Any:
        """The next task, None when there is none (an error is kept to raise in order), or
        ``NOT_YET`` when the source has none ready yet (a stream of arriving files)."""
        if self._tasks_done:
            return None
        try:
            return next(self._tasks)
        except StopIteration:
            pass
        except Exception as e:  # raised after the batches before it
            self._task_error = e
        self._tasks_done = True
        return None

    def _fill(self) -> None:
        n = self.workers
        while self._submitted - self._received < n * self.queue_depth:
            task = self._next_task()
            if task is None or task is NOT_YET:
                return
            self._in[self._submitted % n].put(task)
            self._submitted += 1

    def _get(self, w: int) -> tuple[Any, ...]:
        q, p = self._out[w], self._procs[w]
        t0 = time.perf_counter()
        blocking = False  # first look without waiting: a batch found ready is not a wait
        while True:
            try:
                msg = q.get(block=blocking, timeout=_POLL_S if blocking else None)
                if blocking:
                    waits.record("data_worker", time.perf_counter() - t0)
                return msg
            except queue.Empty:
                if self._closed:  # closed from another thread while we waited
                    raise StopIteration from None
                blocking = True
            except (EOFError, OSError, ValueError):  # the worker is gone (or we were closed)
                if self._closed:
                    raise StopIteration from None
                p.join(timeout=1.0)
                raise WorkerExited(
                    f"data worker {w} (pid {p.pid}) exited with code {p.exitcode} "
                    "before returning its batch"
                ) from None

    def _next_batch(self) -> SparseBatch | None:
        """Build or receive the next batch; None when the tasks are exhausted."""
        if self.workers == 0:
            task = self._next_task()
            while task is NOT_YET and not self._closed:
                time.sleep(_NOT_YET_S)
                task = self._next_task()
            if task is None or task is NOT_YET:
                return None
            t0 = time.perf_counter()
            sent = time.time()
            batch = self.codec.decode(self.codec.encode(task))
            if self.link is not None:
                self.link.transfer(batch.wire_bytes, 1, sent)
            self.wait_s += time.perf_counter() - t0
            return batch
        self._fill()
        while self._received == self._submitted and not self._tasks_done:  # NOT_YET: ask again
            if self._closed:
                raise StopIteration
            time.sleep(_NOT_YET_S)
            self._fill()
        if self._received == self._submitted:
            return None
        w = self._received % self.workers
        t0 = time.perf_counter()
        msg = self._get(w)
        self._received += 1
        if msg[0] == "err":
            raise rebuild_error(msg)
        batch = self.codec.decode(msg[1])
        if self.link is not None:
            self.link.transfer(batch.wire_bytes, 1, msg[2])
        self.wait_s += time.perf_counter() - t0
        self._fill()
        return batch

    def __next__(self) -> SparseBatch:
        """The next batch. ``close()`` may be called from another thread: this then stops."""
        if self._closed:
            raise StopIteration
        try:
            batch = self._next_batch()
        except StopIteration:
            raise
        except BaseException:
            if self._closed:  # closed from another thread (e.g. a prefetcher's owner): just stop
                raise StopIteration from None
            self.close()
            raise
        if batch is None:  # exhausted: stop the workers, then raise a task error kept for last
            err, self._task_error = self._task_error, None
            self._graceful[0] = True
            self.close()
            if err is not None:
                raise err
            raise StopIteration
        self.delivered += 1
        self.bad_records += batch.bad_records
        return batch
