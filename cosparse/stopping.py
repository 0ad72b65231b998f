"""A process-wide stop request: when the process is terminated (SIGTERM), the waits in flight on
other threads that could last long (a PS call to a hung shard, bounded only by its request
timeout) check it on every slice and give up with ``StopRequested``, so the unwinding never waits
them out (``cosparse.exits``)."""

from __future__ import annotations

import threading

_REQUESTED = threading.Event()
_reason = ""


class StopRequested(BaseException):
    """The process is stopping: a wait in flight gave up. A BaseException, like
    KeyboardInterrupt, so that no ``except Exception`` takes it for a failure to handle."""


def request(reason: str) -> None:
    """Ask every checked wait to give up, saying ``reason`` (e.g. "SIGTERM")."""
    global _reason
    _reason = reason
    _REQUESTED.set()


def clear() -> None:
    """Withdraw the request (a command run in-process ended: the next one starts afresh)."""
    _REQUESTED.clear()


def requested() -> bool:
    """Whether a stop was requested."""
    return _REQUESTED.is_set()


def check(what: str) -> None:
    """Raise ``StopRequested`` naming ``what`` gave up, when a stop was requested."""
    if _REQUESTED.is_set():
        raise StopRequested(f"{what}: given up, the process is stopping ({_reason})")
