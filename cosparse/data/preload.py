"""Imported once by the data workers' fork server: loads the worker code and the data readers'
numba kernels before any fork, so each data worker starts warm. Not meant for other importers (it
runs the kernels once).

Only data's own code: layers above (feature extraction, a supply path's worker side) warm
theirs through modules of their own that ``BatchStream(preload=...)`` names.
"""

from __future__ import annotations

import numpy as np

from cosparse.data import kernels as K
from cosparse.data import worker_loop as _worker  # noqa: F401 - the worker entry point


def warm_kernels() -> None:
    """Run each kernel once on tiny inputs (loads the numba cache or compiles)."""
    K.parse_criteo_chunk(np.frombuffer(b"0" + b"\t" * 39 + b"\n", np.uint8), 1)
    K.parse_hex_strings(np.zeros(2, np.int64), np.zeros(0, np.uint8), np.ones(1, np.bool_))
    K.zipf_ids(np.zeros(1), np.ones(1, np.int64), 1, 1, np.ones(1), np.zeros(1, np.int64))


warm_kernels()
