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
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import shutil
import signal
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Iterator
from typing import Any, Protocol

from cosparse.batch import SparseBatch
from cosparse.data import forkserver_guard
from cosparse.data.reader import Reader
from cosparse.lifeline import exit_with_sentinel
from cosparse.link import LinkShaper
from cosparse.owner import owner_tag

_POLL_S = 0.5  # how often a waiting main process checks that its worker is alive


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a data worker (set as ``__cause__``)."""


def _context(start_method: str | None) -> mp.context.BaseContext:
    methods = mp.get_all_start_methods()
    if start_method is None:
        start_method = "forkserver" if "forkserver" in methods else "spawn"
    if start_method == "fork":
        raise ValueError("BatchStream: start method 'fork' is unsafe with torch/numba threads; "
                         "use 'forkserver' or 'spawn'")
    ctx = mp.get_context(start_method)
    _own_temp_dir()
    if start_method == "forkserver":
        # The guard first (the fork server ends with its parent), then torch, numba and the
        # readers, imported once in the fork server, not in every worker.
        preload = ["cosparse.data.forkserver_guard", "cosparse.data.preload"]
        if threading.current_thread() is threading.main_thread():  # (if this starts it)
            preload.insert(1, forkserver_guard.MAIN_THREAD)
        ctx.set_forkserver_preload(preload)
    return ctx


def _own_temp_dir() -> None:
    """Give multiprocessing's temporary directory (the fork server's socket lives there) this
    process's owner tag instead of an anonymous ``pymp-*`` name: removed at exit as before, and
    swept by the next run when this one is killed."""
    from multiprocessing import process, util

    config = process.current_process()._config  # what util.get_temp_dir() reads and sets
    if config.get("tempdir") is not None:
        return
    tempdir = tempfile.mkdtemp(prefix=f"cosparse-mp-{owner_tag()}-")
    util.Finalize(None, shutil.rmtree, args=(tempdir, True), exitpriority=-100)
    config["tempdir"] = tempdir


class WorkerExited(RuntimeError):
    """A data worker process died before returning its batch."""


class PlainCodec:
    """Batches travel as plain numpy arrays through the worker's queue."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader

    def encode(self, task: Any) -> dict[str, Any]:  # in the worker
        return self.reader.build(task).to_arrays()

    def decode(self, payload: dict[str, Any]) -> SparseBatch:  # in the consumer
        batch = SparseBatch.from_arrays(payload)
        batch.wire_bytes = sum(v.nbytes for v in payload.values() if hasattr(v, "nbytes"))
        return batch

    def close(self) -> None:
        pass


class BatchCodec(Protocol):
    """How a task becomes a message in a worker (``encode``) and a batch in the consumer."""

    def encode(self, task: Any) -> Any: ...
    def decode(self, msg: Any) -> SparseBatch: ...
    def close(self) -> None: ...


def _worker_main(codec: BatchCodec, in_q: Any, out_q: Any) -> None:
    """Worker loop: build tasks until the ``None`` sentinel or until the parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process handles Ctrl-C and stops us
    try:  # one core per worker: no thread pool competing with the trainer's
        import torch

        torch.set_num_threads(1)
    except Exception:  # pragma: no cover - torch is a dependency
        pass
    out_q.cancel_join_thread()  # exit promptly even when nobody reads what is left
    parent = mp.parent_process()
    if parent is not None and parent.sentinel is not None:
        # at once when the main process dies, even in a build or a PS pull, not only when idle
        exit_with_sentinel(parent.sentinel, f"data worker pid {os.getpid()}")
    try:
        _serve(codec, in_q, out_q, parent)
    finally:
        codec.close()


def _serve(codec: BatchCodec, in_q: Any, out_q: Any, parent: Any) -> None:
    while True:
        try:
            task = in_q.get(timeout=1.0)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                return
            continue
        if task is None:
            return
        try:
            msg: tuple[Any, ...] = ("ok", codec.encode(task), time.time())
        except Exception as e:  # every error goes back to the main process
            try:
                blob: bytes | None = pickle.dumps(e)
                pickle.loads(blob)
            except Exception:
                blob = None
            msg = ("err", blob, type(e).__name__, str(e), traceback.format_exc())
        out_q.put(msg)


def _shutdown(procs: list[Any], in_qs: list[Any], out_qs: list[Any], graceful: list[bool]) -> None:
    """Stop every worker (sentinel first when ``graceful[0]``, then terminate, then kill)."""
    if graceful and graceful[0]:
        for q in in_qs:
            try:
                q.put_nowait(None)
            except Exception:  # full or closed: terminate below
                pass
        deadline = time.monotonic() + 2.0
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=2.0)
        if p.is_alive():
            p.kill()
            p.join(timeout=2.0)
    for q in (*in_qs, *out_qs):
        try:
            q.cancel_join_thread()
            q.close()
        except Exception:
            pass
    for p in procs:
        try:
            p.close()
        except Exception:  # still running after kill
            pass
    procs.clear()
    in_qs.clear()
    out_qs.clear()


class BatchStream:
    """Iterable of the reader's SparseBatches from ``start_batch`` on, built by ``workers`` processes.

    Counters: ``delivered`` (batches returned), ``bad_records`` (sum over delivered batches),
    ``wait_s`` / ``wait_ms`` (time the consumer spent waiting for batches: stage_ms.read).
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
            self, _shutdown, self._procs, self._in, self._out, self._graceful
        )
        if workers > 0:
            try:
                self._start(start_method)
            except BaseException:
                self.close()
                raise

    # --- lifecycle ---------------------------------------------------------------------------
    def _start(self, start_method: str | None) -> None:
        ctx = _context(start_method)
        for i in range(self.workers):
            in_q = ctx.Queue(maxsize=self.queue_depth)
            out_q = ctx.Queue(maxsize=self.queue_depth)
            p = ctx.Process(
                target=_worker_main, args=(self.codec, in_q, out_q),
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
        """The next task, or None when there is none (an error is kept to raise in order)."""
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
            if task is None:
                return
            self._in[self._submitted % n].put(task)
            self._submitted += 1

    def _get(self, w: int) -> tuple[Any, ...]:
        q, p = self._out[w], self._procs[w]
        while True:
            try:
                return q.get(timeout=_POLL_S)
            except queue.Empty:
                if self._closed:  # closed from another thread while we waited
                    raise StopIteration from None
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
            if task is None:
                return None
            t0 = time.perf_counter()
            sent = time.time()
            batch = self.codec.decode(self.codec.encode(task))
            if self.link is not None:
                self.link.transfer(batch.wire_bytes, 1, sent)
            self.wait_s += time.perf_counter() - t0
            return batch
        self._fill()
        if self._received == self._submitted:
            return None
        w = self._received % self.workers
        t0 = time.perf_counter()
        msg = self._get(w)
        self._received += 1
        if msg[0] == "err":
            raise _rebuild_error(msg)
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


def _rebuild_error(msg: tuple[Any, ...]) -> BaseException:
    _, blob, name, text, tb = msg
    exc: BaseException | None = None
    if blob is not None:
        try:
            exc = pickle.loads(blob)
        except Exception:
            exc = None
    if exc is None:
        exc = RuntimeError(f"{name}: {text}")
    exc.__cause__ = RemoteTraceback(f"\n(in a data worker process)\n{tb}")
    return exc
