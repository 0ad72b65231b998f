"""Imported first by the data workers' fork server (``set_forkserver_preload``): the fork server
ends with the process that started it (the trainer), instead of when its last worker is gone and
a slow interpreter shutdown is over (7 s was seen on a loaded machine).

Two guards: a thread that checks the parent every 0.1 s (``lifeline.exit_when_orphaned``), and,
when the main thread of the trainer started the fork server (``MAIN_THREAD`` is in the preload
list), ``PR_SET_PDEATHSIG`` = SIGKILL, which the kernel delivers even while an import holds the
GIL (the fork server imports torch and numba at start). Not from another thread: the signal
follows the forking thread, and a fork server killed with a model's thread would be restarted
in the middle of another model's start. Elsewhere, importing this module does nothing.
"""

from __future__ import annotations

import os
import signal
import sys

# Not a module: a marker in the preload list (the fork server ignores names it cannot import).
MAIN_THREAD = "cosparse.data.forkserver_guard:started-by-the-main-thread"


def _fork_server_preload() -> list[str] | None:
    """The preload list while ``multiprocessing.forkserver.main`` imports it; None elsewhere."""
    frame = sys._getframe(1)
    suffix = os.path.join("multiprocessing", "forkserver.py")
    while frame is not None:
        code = frame.f_code
        if code.co_name == "main" and code.co_filename.endswith(suffix):
            return list(frame.f_locals.get("preload") or [])
        frame = frame.f_back
    return None


def _guard(preload: list[str]) -> None:
    from cosparse.lifeline import exit_when_orphaned, set_pdeathsig

    parent = os.getppid()
    if MAIN_THREAD in preload:
        set_pdeathsig(signal.SIGKILL)
    exit_when_orphaned(parent, "data-worker fork server")


_preload = _fork_server_preload()
if _preload is not None:
    _guard(_preload)
