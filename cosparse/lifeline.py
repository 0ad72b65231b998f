"""Helper processes (PS shards, data workers, the fork server) that end with their trainer,
however it ends: SIGKILL, SIGTERM, an exception.

- ``exit_when_orphaned(parent_pid)``: a daemon thread checks ``os.getppid()`` every 0.1 s and
  ends this process once its parent is no longer ``parent_pid`` (the parent died and the child
  was handed to init or a subreaper). It does not depend on which thread of the parent forked
  it, nor on this process's main thread being free to run a signal handler.
- ``exit_with_sentinel(fd)``: a daemon thread waits on a pipe end that reaches end-of-file when
  the parent is gone (multiprocessing's parent sentinel), and ends this process at once.
- ``pdeathsig(sig)``: ``PR_SET_PDEATHSIG`` for a ``Popen`` ``preexec_fn``. The kernel sends it
  when the *thread* that forked the child exits, not the process: use it only from a thread
  that lives as long as the process (the main thread).

An orphan ends with ``os._exit``: the trainer that needed it is gone, and whatever it was
writing is atomic (a temporary name, renamed when complete) and swept by the next run.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1
ORPHAN_EXIT = 70  # the exit code of a helper process whose parent was gone


def _leave(what: str, why: str) -> None:
    try:
        sys.stderr.write(f"cosparse: {what}: {why}; exiting\n")
        sys.stderr.flush()
    finally:
        os._exit(ORPHAN_EXIT)


def exit_when_orphaned(parent_pid: int, what: str, interval_s: float = 0.1) -> threading.Thread:
    """End this process within ``interval_s`` of ``parent_pid`` ceasing to be its parent."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval_s)
        _leave(what, f"its parent process {parent_pid} is gone")

    t = threading.Thread(target=watch, name="cosparse-lifeline", daemon=True)
    t.start()
    return t


def exit_with_sentinel(sentinel: int, what: str) -> threading.Thread:
    """End this process as soon as ``sentinel`` (a pipe end the parent holds open) is at EOF."""
    from multiprocessing.connection import wait

    def watch() -> None:
        wait([sentinel])
        _leave(what, "its parent process is gone")

    t = threading.Thread(target=watch, name="cosparse-lifeline", daemon=True)
    t.start()
    return t


def pdeathsig(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel send ``sig`` to the child when the calling thread
    exits; None (nothing to set) off Linux or away from the main thread."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None

    def preexec() -> None:  # runs in the child between fork and exec
        set_pdeathsig(sig)

    return preexec


def set_pdeathsig(sig: int = signal.SIGKILL) -> None:
    """``PR_SET_PDEATHSIG`` for this process: ``sig`` when the thread that forked it exits
    (Linux; elsewhere nothing)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(int(sig)))
    except (OSError, AttributeError):
        pass
