"""Numba row-update kernels: SGD, Adagrad, row-wise Adagrad, Adam.

The batch kernel (``update_checked``) reads gathered rows ``w`` [U, dim] and their state ``s``
[U, sw], the row gradients ``g`` [U, dim], and writes the updated row and state side by side into
``dest[slots[u]]`` (``dest`` is [rows, dim + sw], e.g. the table's slab: written back in one
pass); a negative slot is skipped. It applies a batch all or nothing: when any row's result
(values or state) is NaN or infinite, e.g. Adagrad's accumulator after a gradient of 1e20, every
row is put back as gathered (``w`` and ``s`` are the undo copy, so they must not overlap
``dest``), since such a row would never train again. Arithmetic is float32, no fastmath, no
reduction across rows: results do not depend on the thread count or on where a row lives.

The rule for one row is its own inlined function (``*_row``), which the batch kernels here and
the parameter server's fused kernels (``cosparse.ps.shard_kernels``, which update a slab's row in
place: ``w`` and ``s`` are then the slab itself, ``s`` from column ``so``) share, so every
placement runs the same float32 operations in the same order. A row function reads each value
of its row before it writes that value, so ``dest`` may be ``w``'s own row.

L2 regularisation (``l2``, a float32) acts on the rows a batch touches, in the same place in
every kernel: each gradient element is ``g + l2 * w`` before the rule reads it (``l2 = 0``
leaves the gradient as it is).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

# optimizer kinds as the fused kernels take them (``KIND_CODES[cfg.kind]``)
SGD, ADAGRAD, ROWWISE_ADAGRAD, ADAM = 0, 1, 2, 3
KIND_CODES = {"sgd": SGD, "adagrad": ADAGRAD, "rowwise_adagrad": ROWWISE_ADAGRAD, "adam": ADAM}


@numba.njit(inline="always")
def sgd_row(w, s, so, u, g, gu, dest, r, dim, lr, l2):
    """Row ``u`` of ``w`` (state ``s[u, so:]``) with gradient ``g[gu]`` into ``dest[r]``."""
    for c in range(dim):
        dest[r, c] = w[u, c] - lr * (g[gu, c] + l2 * w[u, c])


@numba.njit(inline="always")
def adagrad_row(w, s, so, u, g, gu, dest, r, dim, lr, eps, l2):
    for c in range(dim):
        gc = g[gu, c] + l2 * w[u, c]
        acc = s[u, so + c] + gc * gc
        dest[r, dim + c] = acc
        dest[r, c] = w[u, c] - lr * gc / (np.sqrt(acc) + eps)


@numba.njit(inline="always")
def rowwise_adagrad_row(w, s, so, u, g, gu, dest, r, dim, lr, eps, l2):
    inv_dim = np.float32(1.0) / np.float32(dim)
    sq = np.float32(0.0)
    for c in range(dim):  # within-row reduction, fixed order
        gc = g[gu, c] + l2 * w[u, c]
        sq += gc * gc
    _rowwise_adagrad_apply(w, s, so, u, g, gu, dest, r, dim, sq, inv_dim, lr, eps, l2)


@numba.njit(inline="always")
def rowwise_adagrad_4(w, s, so, u0, u1, u2, u3, g, gu, dest, r0, r1, r2, r3, dim, lr, eps, l2):
    """``rowwise_adagrad_row`` on four distinct rows (``w[u0..u3]``, gradients ``g[gu .. gu+3]``,
    into ``dest[r0..r3]``), their squared-gradient sums interleaved: each row's sum still runs in
    column order with the same float32 operations, so each row is bit-identical to
    ``rowwise_adagrad_row``'s; the four independent chains of additions keep the CPU busy where
    one chain waits on each addition's latency. In place on a slab: ``w``, ``s`` and ``dest``
    are the slab, ``so = dim`` and ``u_k = r_k``."""
    inv_dim = np.float32(1.0) / np.float32(dim)
    sq0 = np.float32(0.0)
    sq1 = np.float32(0.0)
    sq2 = np.float32(0.0)
    sq3 = np.float32(0.0)
    for c in range(dim):
        g0 = g[gu, c] + l2 * w[u0, c]
        g1 = g[gu + 1, c] + l2 * w[u1, c]
        g2 = g[gu + 2, c] + l2 * w[u2, c]
        g3 = g[gu + 3, c] + l2 * w[u3, c]
        sq0 += g0 * g0
        sq1 += g1 * g1
        sq2 += g2 * g2
        sq3 += g3 * g3
    _rowwise_adagrad_apply(w, s, so, u0, g, gu, dest, r0, dim, sq0, inv_dim, lr, eps, l2)
    _rowwise_adagrad_apply(w, s, so, u1, g, gu + 1, dest, r1, dim, sq1, inv_dim, lr, eps, l2)
    _rowwise_adagrad_apply(w, s, so, u2, g, gu + 2, dest, r2, dim, sq2, inv_dim, lr, eps, l2)
    _rowwise_adagrad_apply(w, s, so, u3, g, gu + 3, dest, r3, dim, sq3, inv_dim, lr, eps, l2)


@numba.njit(inline="always")
def _rowwise_adagrad_apply(w, s, so, u, g, gu, dest, r, dim, sq, inv_dim, lr, eps, l2):
    """The second half of ``rowwise_adagrad_row``, given row ``u``'s squared-gradient sum."""
    acc = s[u, so] + sq * inv_dim
    scale = lr / (np.sqrt(acc) + eps)
    for c in range(dim):
        dest[r, c] = w[u, c] - scale * (g[gu, c] + l2 * w[u, c])
    dest[r, dim] = acc


@numba.njit(inline="always")
def adam_row(w, s, so, u, g, gu, dest, r, dim, lr, eps, l2, beta1, beta2, corr1, corr2):
    one = np.float32(1.0)
    for c in range(dim):
        gc = g[gu, c] + l2 * w[u, c]
        m = beta1 * s[u, so + c] + (one - beta1) * gc
        v = beta2 * s[u, so + dim + c] + (one - beta2) * gc * gc
        dest[r, dim + c] = m
        dest[r, 2 * dim + c] = v
        dest[r, c] = w[u, c] - lr * (m / corr1) / (np.sqrt(v / corr2) + eps)


@numba.njit(inline="always")
def update_row(kind, w, s, so, u, g, gu, dest, r, dim, lr, eps, l2, beta1, beta2, corr1, corr2):
    """The rule ``kind`` (``KIND_CODES``) for one row, as the batch kernels below apply it."""
    if kind == SGD:
        sgd_row(w, s, so, u, g, gu, dest, r, dim, lr, l2)
    elif kind == ADAGRAD:
        adagrad_row(w, s, so, u, g, gu, dest, r, dim, lr, eps, l2)
    elif kind == ROWWISE_ADAGRAD:
        rowwise_adagrad_row(w, s, so, u, g, gu, dest, r, dim, lr, eps, l2)
    else:
        adam_row(w, s, so, u, g, gu, dest, r, dim, lr, eps, l2, beta1, beta2, corr1, corr2)


@numba.njit(inline="always")
def row_finite(a, r, width):
    """Whether ``a[r, :width]`` holds no NaN and no infinity (no early exit: a loop that the
    compiler vectorises)."""
    ok = True
    for c in range(width):
        ok &= np.isfinite(a[r, c])
    return ok


@numba.njit(cache=True, nogil=True, parallel=True)
def update_checked(kind, w, s, g, dest, slots, lr, eps, l2, beta1, beta2, corr1, corr2):
    """The rule ``kind`` on every row ``u`` with ``slots[u] >= 0`` into ``dest[slots[u]]``
    (``update_row``), all or nothing: when any row's new values or state are NaN or infinite,
    every row written is put back from ``w`` and ``s`` (the gathered rows, which must not
    overlap ``dest``). Returns how many rows would have become non-finite (then ``dest`` is as
    it was). Adam's ``corr1 = 1 - beta1**t``, ``corr2 = 1 - beta2**t`` (float32, computed by the
    caller)."""
    dim = w.shape[1]
    width = dim + s.shape[1]
    bad = 0
    quads = (w.shape[0] + 3) // 4  # row-wise Adagrad takes four rows at a time (ILP)
    for q in prange(quads):
        u0 = 4 * q
        u1 = min(u0 + 4, w.shape[0])
        if (kind == ROWWISE_ADAGRAD and u1 - u0 == 4 and slots[u0] >= 0 and slots[u0 + 1] >= 0
                and slots[u0 + 2] >= 0 and slots[u0 + 3] >= 0):
            rowwise_adagrad_4(w, s, 0, u0, u0 + 1, u0 + 2, u0 + 3, g, u0, dest, slots[u0],
                              slots[u0 + 1], slots[u0 + 2], slots[u0 + 3], dim, lr, eps, l2)
        else:
            for u in range(u0, u1):
                if slots[u] >= 0:  # a negative slot: a row that trains nothing (not admitted)
                    update_row(kind, w, s, 0, u, g, u, dest, slots[u], dim, lr, eps, l2,
                               beta1, beta2, corr1, corr2)
        for u in range(u0, u1):
            if slots[u] >= 0 and not row_finite(dest, slots[u], width):
                bad += 1
    if bad > 0:  # undo: the rows as gathered
        for u in prange(w.shape[0]):
            r = slots[u]
            if r >= 0:
                dest[r, :dim] = w[u]
                dest[r, dim:width] = s[u]
    return bad
