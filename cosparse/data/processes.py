"""Starting and stopping data worker processes: the multiprocessing context (``forkserver`` or
``spawn``, never ``fork``; the fork server's preload list; a temporary directory carrying this
process's owner tag) and the shutdown of a stream's workers and queues."""

from __future__ import annotations

import multiprocessing as mp
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

from cosparse.data import forkserver_guard
from cosparse.owner import owner_tag

# imported by the fork server before anything a caller adds: the guard first (the fork server
# ends with its parent), then the data workers' code and kernels
BASE_PRELOAD = ("cosparse.data.forkserver_guard", "cosparse.data.preload")


def check_preload(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` as a tuple, each checked to be a dotted module name (ValueError otherwise)."""
    if isinstance(names, str):
        raise ValueError(f"preload: expected a sequence of module names, got the string {names!r}")
    for name in names:
        if not isinstance(name, str) or not all(p.isidentifier() for p in name.split(".")):
            raise ValueError(f"preload: {name!r} is not a dotted module name")
    return tuple(names)


def worker_context(start_method: str | None, preload: Sequence[str] = ()) -> mp.context.BaseContext:
    """The context to start data workers in (default: forkserver where available, else spawn).

    With forkserver, the fork server imports ``BASE_PRELOAD`` and then ``preload`` once, before
    any fork; that takes effect when this call's workers start the fork server."""
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
        names = [*BASE_PRELOAD, *preload]
        if threading.current_thread() is threading.main_thread():  # (if this starts it)
            names.insert(1, forkserver_guard.MAIN_THREAD)
        ctx.set_forkserver_preload(names)
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


def shutdown(procs: list[Any], in_qs: list[Any], out_qs: list[Any], graceful: list[bool]) -> None:
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
