"""Row kernels over a slab (rows of values followed by optimizer state): gathers, copies between
slabs, and deterministic row initialisation from (seed, ID, column)."""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from cosparse.store.kernels.hashing import GOLDEN, mix64
from cosparse.store.kernels.variants import variant


@numba.njit(cache=True, nogil=True, parallel=True)
def gather_rows(slab, slots, dim, out_w, out_s):
    """out_w[u] = slab[slots[u], :dim]; out_s[u] = slab[slots[u], dim:] (one pass over each row).

    A negative slot reads zeros (an ID not yet admitted).
    """
    width = slab.shape[1]
    for u in prange(slots.shape[0]):
        s = slots[u]
        if s < 0:  # not admitted: the shared default (zero) row
            for c in range(dim):
                out_w[u, c] = 0.0
            for c in range(dim, width):
                out_s[u, c - dim] = 0.0
            continue
        for c in range(dim):
            out_w[u, c] = slab[s, c]
        for c in range(dim, width):
            out_s[u, c - dim] = slab[s, c]


@numba.njit(inline="always")
def init_seed(seed):
    """The per-table seed mix that ``init_row`` takes (``seed``: the table's seed)."""
    return mix64(np.uint64(seed) * GOLDEN + np.uint64(0x632BE59BD9B4E019))


@numba.njit(inline="always")
def init_row(slab, r, id_, s64, dim, kind, a, b, state_value, col0):
    """Initialise ``slab[r]`` for ID ``id_`` (``s64 = init_seed(seed)``): ``_init_rows``'s
    arithmetic for one row (``_init_rows`` calls it per row), inlined where a kernel creates rows
    one at a time (the parameter server's fused kernels, which must not call a cached dispatcher
    that may hold a parallel build)."""
    width = slab.shape[1]
    base = mix64(s64 ^ np.uint64(id_))
    for c in range(dim):
        cc = col0 + c
        h1 = mix64(base + np.uint64(2 * cc + 1) * GOLDEN)
        u1 = np.float64(h1 >> np.uint64(11)) * (1.0 / 9007199254740992.0)
        if kind == 0:
            slab[r, c] = np.float32(a + (b - a) * u1)
        else:
            h2 = mix64(base + np.uint64(2 * cc + 2) * GOLDEN)
            u2 = np.float64(h2 >> np.uint64(11)) * (1.0 / 9007199254740992.0)
            z = np.sqrt(-2.0 * np.log(1.0 - u1)) * np.cos(2.0 * np.pi * u2)
            slab[r, c] = np.float32(a * z)
    for c in range(dim, width):
        slab[r, c] = state_value


def _init_rows(slab, slots, ids, seed, dim, kind, a, b, state_value, col0):
    """Initialise rows ``slots`` for ``ids``: each value is a pure function of (seed, id, column).

    ``col0``: the full row's column of this slab's column 0 (a column-wise shard holds columns
    ``col0 .. col0 + dim``, with the values those columns have in the whole row).

    kind 0: uniform(a, b); kind 1: normal(0, a) by Box-Muller. Optimizer state <- state_value.
    """
    s64 = init_seed(seed)
    for i in prange(slots.shape[0]):
        init_row(slab, slots[i], ids[i], s64, dim, kind, a, b, state_value, col0)


init_rows = variant(_init_rows, "init_rows", nogil=True, parallel=True)
# for the planner's thread (a cache entry of its own: ``variants``)
init_rows_serial = variant(_init_rows, "init_rows_serial", nogil=True)


# The planner moves rows on its background thread while the trainer's torch ops use the cores:
# these copies are serial on purpose (a parallel region stalls when a core is busy).
@numba.njit(cache=True, nogil=True)
def take_rows(slab, slots, out):
    """out[i] = slab[slots[i]] (whole rows: values and optimizer state)."""
    width = slab.shape[1]
    for i in range(slots.shape[0]):
        s = slots[i]
        for c in range(width):
            out[i, c] = slab[s, c]


@numba.njit(cache=True, nogil=True)
def put_rows(slab, slots, rows):
    """slab[slots[i]] = rows[i] (slots are distinct)."""
    width = slab.shape[1]
    for i in range(slots.shape[0]):
        s = slots[i]
        for c in range(width):
            slab[s, c] = rows[i, c]


@numba.njit(cache=True, nogil=True)
def move_rows(src, src_slots, dst, dst_slots):
    """dst[dst_slots[i]] = src[src_slots[i]]: one copy between two tiers' slabs, no temporary."""
    width = src.shape[1]
    for i in range(src_slots.shape[0]):
        s = src_slots[i]
        d = dst_slots[i]
        for c in range(width):
            dst[d, c] = src[s, c]
