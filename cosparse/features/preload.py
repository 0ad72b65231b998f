"""Imported once by the data workers' fork server when a caller names it in
``BatchStream(preload=...)``: loads the feature extraction code and runs the feature kernels
once before any fork, so each data worker that extracts features starts warm. Not meant for
other importers (it runs the kernels once)."""

from __future__ import annotations

import numpy as np

from cosparse.features import kernels as K
from cosparse.features import reader as _reader  # noqa: F401 - extraction in the workers


def warm_kernels() -> None:
    """Run the hashing kernels once on tiny inputs (loads the numba cache or compiles)."""
    K.hash_ints(np.zeros(1, np.int64), 1, 0)
    K.hash_cross(np.zeros((1, 2), np.int64), 1, 0)


warm_kernels()
