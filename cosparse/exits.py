"""Exit codes of the command line: every run-time failure ends in one clear line.

Each failure class maps to an exit code, a name for what failed and what to do about it. The
CLI prints ``cosparse: <what>: <message> (<what to do>)`` on stderr and exits with the code;
``--debug`` prints the traceback as well. The README's "Failure behaviour" table lists them.

| code | failure                                                                 |
|------|-------------------------------------------------------------------------|
| 0    | success                                                                 |
| 1    | an internal error (a bug): the message asks for ``--debug``            |
|      | (and ``cosparse check``: a placement not bit-identical, in its table)  |
| 2    | configuration or usage (bad key or value, a store too small, --fresh),  |
|      | a PS namespace over its quota or a PS shard's row budget full           |
| 3    | data (a bad record, with file:line:column)                              |
| 4    | the PS: a shard unreachable, silent, refusing our key or our namespace  |
| 5    | a data worker died, or the rows it delivered were unusable              |
| 6    | a stall: a wait whose other side made no progress (train.stall_timeout_s) |
| 7    | a checkpoint could not be written (disk full, I/O error) or read        |
| 8    | the loss became NaN or infinite (train.on_nonfinite: stop), or an       |
|      | optimizer update would have made embedding rows NaN or infinite         |
| 130  | interrupted (Ctrl-C)                                                    |
| 143  | terminated (SIGTERM)                                                    |
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from cosparse import stopping

OK, INTERNAL, USAGE, DATA, PS, WORKER, STALL, CHECKPOINT, NONFINITE = 0, 1, 2, 3, 4, 5, 6, 7, 8
INTERRUPTED, TERMINATED = 130, 143
TERM_GRACE_S = 15.0  # after SIGTERM, the cleanup's bound: then the process exits regardless

_RESUME = "rerun with --resume CHECKPOINT_DIR to go on from the last checkpoint"


@dataclass(frozen=True)
class Failure:
    """How one class of failure is reported."""

    code: int
    what: str
    advice: str


class Terminated(stopping.StopRequested):
    """SIGTERM arrived: unwind like Ctrl-C, so every ``finally`` stops its processes."""


def _classify(e: BaseException) -> Failure:
    """The failure class of ``e`` (imports lazily: ``cosparse --help`` loads no torch)."""
    from cosparse.config import ConfigError
    from cosparse.data.errors import DataError, DataLayoutError
    from cosparse.data.pool import WorkerExited
    from cosparse.optim import NonFiniteUpdate
    from cosparse.ps import protocol
    from cosparse.ps.client import PSAccessDenied, PSAuthError, PSError, PSFull, PSNonFinite, PSUnavailable
    from cosparse.stall import StallError
    from cosparse.store.types import CapacityError
    from cosparse.supply.collaborative import DeliveryError, SupplyFailure
    from cosparse.supply.versions import StaleRowError
    from cosparse.train.checkpoint import CheckpointError
    from cosparse.train.nonfinite import NonFiniteLoss

    if isinstance(e, KeyboardInterrupt):
        return Failure(INTERRUPTED, "interrupted", _RESUME)
    if isinstance(e, stopping.StopRequested):  # Terminated, or a wait it gave up
        return Failure(TERMINATED, "terminated (SIGTERM)", _RESUME)
    if isinstance(e, DataLayoutError):  # the message names the key to set
        return Failure(DATA, "data error", "")
    if isinstance(e, DataError):
        return Failure(DATA, "data error", "fix the record, or set data.on_bad_record: skip")
    if isinstance(e, PSAuthError):
        return Failure(PS, "PS authentication failed",
                       "give the trainer the key the shards hold for its namespace "
                       "(store.remote.auth_key, store.remote.namespace)")
    if isinstance(e, PSFull):  # the message names the quota or budget and the key that sets it
        what = "PS namespace over its quota" if e.code == protocol.E_QUOTA else "PS shard full"
        return Failure(USAGE, what, f"raise it or add shards, then {_RESUME}")
    if isinstance(e, PSAccessDenied):
        return Failure(PS, "PS access denied",
                       "a namespace writes only its own tables, and reads another's only if that "
                       "namespace lists it as a reader (ps serve --namespaces FILE)")
    if isinstance(e, PSNonFinite):
        return Failure(NONFINITE, "non-finite update", "")  # the message says what to do
    if isinstance(e, PSUnavailable | PSError):
        return Failure(PS, "PS unavailable", f"check or restart the shard, then {_RESUME}")
    if isinstance(e, WorkerExited | SupplyFailure | DeliveryError):
        return Failure(WORKER, "data worker failed",
                       f"set supply.fallback: ps-direct to go on without it, or {_RESUME}")
    if isinstance(e, StallError):
        return Failure(STALL, "hang detected", _RESUME)
    if isinstance(e, CheckpointError):
        return Failure(CHECKPOINT, "checkpoint error", "")  # the message says what to do
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return Failure(CHECKPOINT, "disk full", f"free disk space, then {_RESUME}")
    if isinstance(e, NonFiniteLoss | NonFiniteUpdate):
        return Failure(NONFINITE, "non-finite loss" if isinstance(e, NonFiniteLoss) else
                       "non-finite update", "")  # the message says what to do
    if isinstance(e, StaleRowError):  # train.check_versions caught the engine reading old rows
        return Failure(INTERNAL, "stale row", "an engine bug: report it with this line")
    if isinstance(e, ConfigError | CapacityError | ValueError):  # FeatureSpecError too
        return Failure(USAGE, "error", "")
    return Failure(INTERNAL, f"internal error ({type(e).__name__})",
                   "rerun with --debug for the traceback, and report it")


_REPORTED = "_cosparse_reported"  # set on an exception whose line ``report_now`` printed
_debug = False  # run_reported's --debug, for report_now


def report_now(e: BaseException) -> None:
    """Print ``e``'s line now, before the cleanup that unwinds it (stopping shards and workers
    can take seconds); ``report`` then returns its exit code without printing it again."""
    report(e, _debug)
    try:
        setattr(e, _REPORTED, True)
    except AttributeError:  # an exception type without attributes: reported again at the end
        pass


def _unwinding_cause(e: BaseException) -> BaseException:
    """The Ctrl-C or stop request that ``e`` was raised while unwinding, else ``e``.

    A signal's exception lands between any two bytecodes: inside ``Condition.wait``, after
    the wait released the lock and before it took it back, the ``with`` block's exit then
    raises "cannot release un-acquired lock". That error is the interruption's, not a bug."""
    seen: set[int] = set()
    cause: BaseException | None = e
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt | stopping.StopRequested):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return e


def report(e: BaseException, debug: bool = False) -> int:
    """Print ``e`` as one line (plus the traceback with ``debug``); return its exit code."""
    if debug and _unwinding_cause(e) is not e:
        traceback.print_exception(e, file=sys.stderr)  # (what the unwinding raised, for --debug)
    e = _unwinding_cause(e)
    f = _classify(e)
    if getattr(e, _REPORTED, False):
        return f.code
    if debug:
        traceback.print_exception(e, file=sys.stderr)
    text = str(e).strip() or type(e).__name__
    advice = f" ({f.advice})" if f.advice else ""
    print(f"cosparse: {f.what}: {text}{advice}", file=sys.stderr)
    return f.code


def run_reported(body: Callable[[], int], debug: bool = False) -> int:
    """Run a command; any failure becomes one line and its exit code. SIGTERM prints its line
    at once, gives up the waits in flight on other threads (``cosparse.stopping``: a PS call to
    a hung shard) and unwinds the command (its ``finally`` blocks stop the processes it started)
    like Ctrl-C does, within ``TERM_GRACE_S``; a second SIGTERM, or a cleanup that overruns,
    exits at once with 143."""

    signalled: list[bool] = []

    def on_term(signum: int, frame: object) -> None:
        # unwind now; if the cleanup itself hangs, exit anyway (the children watch this process)
        signal.signal(signal.SIGTERM, lambda *_: os._exit(TERMINATED))  # a second one: at once
        signalled.append(True)
        deadline = threading.Timer(TERM_GRACE_S, os._exit, (TERMINATED,))
        deadline.daemon = True
        deadline.start()
        stopping.request("SIGTERM")
        e = Terminated("SIGTERM")
        report_now(e)  # (the line comes first, whatever the cleanup takes)
        raise e

    global _debug
    outer_debug, _debug = _debug, debug  # (restored: a command run in-process leaves none)
    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        code = body()
    except (Exception, KeyboardInterrupt, Terminated) as e:
        code = report(e, debug)
    finally:
        signal.signal(signal.SIGTERM, previous)
        _debug = outer_debug
        stopping.clear()
    if signalled:  # the command's cleanup is done: exit without the interpreter's teardown
        _exit_now(code)
    return code


def _exit_now(code: int) -> None:
    """Run the exit hooks (``atexit``, ``weakref.finalize``: what stops processes and removes
    files), flush, and exit with ``code`` without tearing the interpreter down: after SIGTERM,
    the teardown of torch's and the other extensions' modules took seconds on a loaded host
    (until the grace timer cut it short, past 5 s)."""
    import atexit

    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # (a closed pipe: nothing more to say)
                pass
        os._exit(code)
