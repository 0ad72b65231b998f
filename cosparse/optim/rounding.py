"""Rounding float32 row values to 16-bit rows (fp16, bf16), stochastically and exactly.

A 16-bit row stores each value's bit pattern as ``uint16`` (torch views it as ``float16`` or
``bfloat16``). The optimizer computes in float32 and rounds the result back:

- ``nearest``: round to nearest, ties to even (what ``tensor.to(torch.bfloat16)`` does);
- ``stochastic``: round up with probability equal to the distance from the value below, over
  the spacing between the two neighbours, so the rounding is unbiased: small updates are kept on
  average instead of being lost.

The stochastic draw is a counter-based hash of ``(seed, step, row ID, column)``, never a
generator's next number: the same update of the same row rounds the same way wherever the row
lives (a device slab, host memory, a PS shard), in whatever order the rows are updated, and on a
resumed run. That keeps every placement bit-identical.

Written by hand: no library rounds to fp16/bf16 stochastically with a caller-given counter key
(torch draws from its global generator), and the kernels that update rows in place need it as an
inlined numba function.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

FP16, BF16 = 0, 1
DTYPE_CODES = {"fp16": FP16, "bf16": BF16}
NEAREST, STOCHASTIC = 0, 1
ROUNDING_CODES = {"nearest": NEAREST, "stochastic": STOCHASTIC}

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


@numba.njit(inline="always")
def mix64(x):
    """SplitMix64's finaliser: a bijection of uint64 whose output bits each depend on every
    input bit."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


@numba.njit(inline="always")
def row_key(seed, step, row_id):
    """The key of one row's update at ``step``: a hash of (seed, step, row ID)."""
    k = mix64(np.uint64(seed) * _GOLDEN + np.uint64(step))
    return mix64(k ^ (np.uint64(row_id) * _GOLDEN))


@numba.njit(inline="always")
def column_bits(key, column):
    """24 uniform bits for ``column`` of the row whose key is ``key``."""
    return mix64(key + np.uint64(column + 1) * _GOLDEN) >> np.uint64(40)


@numba.njit(inline="always")
def f32_bits(x):
    return np.float32(x).view(np.uint32)


@numba.njit(inline="always")
def to_bf16(x, mode, noise):
    """The bf16 bits of float32 ``x``: ``noise`` (24 uniform bits; its top 16 are used) decides
    a stochastic rounding. NaN stays NaN, infinities stay infinite."""
    b = f32_bits(x)
    if (b & np.uint32(0x7F800000)) == np.uint32(0x7F800000):  # NaN or infinity
        if b & np.uint32(0x007FFFFF):
            return np.uint16((b >> np.uint32(16)) | np.uint32(0x0040))  # (a quiet NaN)
        return np.uint16(b >> np.uint32(16))
    if mode == STOCHASTIC:
        add = np.uint32(noise >> np.uint64(8)) & np.uint32(0xFFFF)
    else:  # nearest, ties to even
        add = np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))
    return np.uint16((np.uint64(b) + np.uint64(add)) >> np.uint64(16))


@numba.njit(inline="always")
def _fp16_magnitude(a):
    """The fp16 bits of float32 ``a >= 0``, which fp16 represents exactly (or is beyond its
    range: then infinity)."""
    if a >= np.float32(65520.0):
        return np.uint16(0x7C00)
    if a < np.float32(6.103515625e-05):  # zero or a subnormal: a multiple of 2^-24
        return np.uint16(np.int64(a * np.float32(16777216.0)))
    b = f32_bits(a)
    e = np.int64((b >> np.uint32(23)) & np.uint32(0xFF)) - 127 + 15
    return np.uint16(e << 10) | np.uint16((b >> np.uint32(13)) & np.uint32(0x3FF))


@numba.njit(inline="always")
def to_fp16(x, mode, noise):
    """The fp16 bits of float32 ``x``: ``noise`` (24 uniform bits) decides a stochastic
    rounding between the two fp16 neighbours of ``x``. Beyond fp16's range: infinity."""
    b = f32_bits(x)
    if (b & np.uint32(0x7F800000)) == np.uint32(0x7F800000):  # NaN or infinity
        nan = np.uint16(0x0200) if b & np.uint32(0x007FFFFF) else np.uint16(0)
        return np.uint16((b >> np.uint32(16)) & np.uint32(0x8000)) | np.uint16(0x7C00) | nan
    a = abs(np.float32(x))
    e = max(np.int64((b >> np.uint32(23)) & np.uint32(0xFF)) - 127, -14)
    ulp = np.float32(2.0) ** np.float32(e - 10)  # (the fp16 spacing at |x|: exact)
    t = a / ulp  # (exact: a power-of-two scaling)
    n = np.floor(t)
    frac = t - n  # (exact)
    if mode == STOCHASTIC:
        up = frac * np.float32(16777216.0) > np.float32(noise)
    else:  # nearest, ties to even
        up = frac > np.float32(0.5) or (frac == np.float32(0.5) and np.fmod(n, 2.0) == 1.0)
    q = (n + np.float32(1.0) if up else n) * ulp
    return np.uint16((b >> np.uint32(16)) & np.uint32(0x8000)) | _fp16_magnitude(q)


@numba.njit(inline="always")
def round_value(x, dtype, mode, noise):
    """The 16-bit pattern (``dtype`` FP16 or BF16) of float32 ``x``."""
    return to_fp16(x, mode, noise) if dtype == FP16 else to_bf16(x, mode, noise)


@numba.njit(cache=True, nogil=True, parallel=True)
def round_rows(values, row_ids, seed, step, dtype, mode, out):
    """``out[u, c]``: the 16-bit pattern of ``values[u, c]`` (float32 [U, D]), the row's ID
    ``row_ids[u]`` and ``(seed, step)`` keying its stochastic rounding."""
    for u in prange(values.shape[0]):
        key = row_key(seed, step, row_ids[u])
        for c in range(values.shape[1]):
            noise = column_bits(key, c) if mode == STOCHASTIC else np.uint64(0)
            out[u, c] = round_value(values[u, c], dtype, mode, noise)


def rounded(values: np.ndarray, row_ids: np.ndarray, seed: int, step: int, dtype: str,
            rounding: str) -> np.ndarray:
    """uint16 [U, D]: ``values`` (float32 [U, D]) rounded to ``dtype`` (``fp16`` or ``bf16``)
    by ``rounding`` (``stochastic`` or ``nearest``), row ``u`` keyed by ``row_ids[u]``."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    out = np.empty(values.shape, np.uint16)
    round_rows(values, np.ascontiguousarray(row_ids, dtype=np.int64).view(np.uint64),
               np.uint64(seed), np.uint64(step), DTYPE_CODES[dtype], ROUNDING_CODES[rounding],
               out)
    return out
