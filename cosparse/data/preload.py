"""Imported once by the forkserver: loads the worker code and the numba kernels before any fork,
so each data worker starts warm. Not meant for other importers (it runs the kernels once)."""

from __future__ import annotations

import numpy as np

from cosparse.data import kernels as K
from cosparse.data import pool as _pool  # noqa: F401 - the worker entry point
from cosparse.features import kernels as FK  # the feature platform's kernels (extraction)
from cosparse.features import reader as _features  # noqa: F401 - extraction in the workers
from cosparse.supply.collaborative import worker as _collab  # noqa: F401 - B's worker side


def warm_kernels() -> None:
    """Run each kernel once on tiny inputs (loads the numba cache or compiles)."""
    K.parse_criteo_chunk(np.frombuffer(b"0" + b"\t" * 39 + b"\n", np.uint8), 1)
    K.parse_hex_strings(np.zeros(2, np.int64), np.zeros(0, np.uint8), np.ones(1, np.bool_))
    K.zipf_ids(np.zeros(1), np.ones(1, np.int64), 1, 1, np.ones(1), np.zeros(1, np.int64))
    FK.hash_ints(np.zeros(1, np.int64), 1, 0)
    FK.hash_cross(np.zeros((1, 2), np.int64), 1, 0)


warm_kernels()
