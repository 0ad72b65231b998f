"""OpenMP's wait policy for every process of a run: passive unless the environment says otherwise.

Torch's and numba's thread pools here are libgomp's, whose idle threads spin for a while before
they sleep. On a host whose cores are shared with other processes, a spinning thread burns the
time slice that the thread it waits for needs, so each parallel region can cost a scheduler
latency or more. ``OMP_WAIT_POLICY=PASSIVE`` makes them sleep at once. Measured (README, "CPU
threads"): the DIN exactness test beside six busy loops ran in 25.9 s passive against 127.7 s
with the default; on an idle host passive cost 3.6% of the engine's throughput.

libgomp reads the variable once, when it is loaded, so it must be set before torch or numba is
imported. ``import cosparse`` sets it (only where the environment has none): every ``cosparse``
command, and every child process (data workers, embedded PS shards) inherits it. A program that
imported torch before cosparse keeps the policy torch started with (its children still get
passive); ``state()`` says which.
"""

from __future__ import annotations

import os
import sys

VARIABLE = "OMP_WAIT_POLICY"
DEFAULT = "PASSIVE"

_given = os.environ.get(VARIABLE)
_loaded_first = [m for m in ("torch", "numba") if m in sys.modules]
if _given is None:  # (too late for this process if torch came first, not for its children)
    os.environ[VARIABLE] = DEFAULT


def state() -> dict[str, object]:
    """The wait policy this process's OpenMP pools run with, and where it came from."""
    if _given is not None:
        return {"wait_policy": _given.upper(), "source": "environment"}
    if _loaded_first:
        return {"wait_policy": "default (spin, then sleep)",
                "source": f"{' and '.join(_loaded_first)} imported before cosparse"}
    return {"wait_policy": DEFAULT, "source": "cosparse"}
