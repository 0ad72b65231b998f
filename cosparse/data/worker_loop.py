"""The data worker process: its entry point and loop (build each task with the codec until the
``None`` sentinel or the parent's death), and how a worker's exception travels back to be
re-raised in the main process with the same type and message."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import signal
import time
import traceback
from typing import Any

from cosparse.data.codec import BatchCodec
from cosparse.lifeline import exit_with_sentinel


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a data worker (set as ``__cause__``)."""


def worker_main(codec: BatchCodec, in_q: Any, out_q: Any) -> None:
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


def rebuild_error(msg: tuple[Any, ...]) -> BaseException:
    """The exception of an ``("err", ...)`` message, its worker traceback as ``__cause__``."""
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
