"""Numba row-update kernels: SGD, Adagrad, row-wise Adagrad, Adam.

Each kernel reads gathered rows ``w`` [U, dim] and their state ``s`` [U, sw], the row gradients
``g`` [U, dim], and writes the updated row and state side by side into ``dest[slots[u]]``
(``dest`` is [rows, dim + sw]); a negative slot is skipped. Pass ``dest`` = the table's slab
to write back in one pass, or a compact buffer with ``slots`` = arange to update in place.
Arithmetic is float32, no fastmath, no reduction across rows: results do not depend on the
thread count or on where a row lives.

L2 regularisation (``l2``, a float32) acts on the rows a batch touches, in the same place in
every kernel: each gradient element is ``g + l2 * w`` before the rule reads it (``l2 = 0``
leaves the gradient as it is).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange


@numba.njit(cache=True, nogil=True, parallel=True)
def sgd_update(w, s, g, dest, slots, lr, l2):
    dim = w.shape[1]
    for u in prange(w.shape[0]):
        r = slots[u]
        if r < 0:  # a row that trains nothing (not admitted)
            continue
        for c in range(dim):
            dest[r, c] = w[u, c] - lr * (g[u, c] + l2 * w[u, c])


@numba.njit(cache=True, nogil=True, parallel=True)
def adagrad_update(w, s, g, dest, slots, lr, eps, l2):
    dim = w.shape[1]
    for u in prange(w.shape[0]):
        r = slots[u]
        if r < 0:  # a row that trains nothing (not admitted)
            continue
        for c in range(dim):
            gc = g[u, c] + l2 * w[u, c]
            acc = s[u, c] + gc * gc
            dest[r, dim + c] = acc
            dest[r, c] = w[u, c] - lr * gc / (np.sqrt(acc) + eps)


@numba.njit(cache=True, nogil=True, parallel=True)
def rowwise_adagrad_update(w, s, g, dest, slots, lr, eps, l2):
    dim = w.shape[1]
    inv_dim = np.float32(1.0) / np.float32(dim)
    for u in prange(w.shape[0]):
        r = slots[u]
        if r < 0:  # a row that trains nothing (not admitted)
            continue
        sq = np.float32(0.0)
        for c in range(dim):  # within-row reduction, fixed order
            gc = g[u, c] + l2 * w[u, c]
            sq += gc * gc
        acc = s[u, 0] + sq * inv_dim
        scale = lr / (np.sqrt(acc) + eps)
        for c in range(dim):
            dest[r, c] = w[u, c] - scale * (g[u, c] + l2 * w[u, c])
        dest[r, dim] = acc


@numba.njit(cache=True, nogil=True, parallel=True)
def adam_update(w, s, g, dest, slots, lr, eps, l2, beta1, beta2, corr1, corr2):
    """s = [m | v]; corr1 = 1 - beta1**t, corr2 = 1 - beta2**t (float32, computed by the caller)."""
    dim = w.shape[1]
    one = np.float32(1.0)
    for u in prange(w.shape[0]):
        r = slots[u]
        if r < 0:  # a row that trains nothing (not admitted)
            continue
        for c in range(dim):
            gc = g[u, c] + l2 * w[u, c]
            m = beta1 * s[u, c] + (one - beta1) * gc
            v = beta2 * s[u, dim + c] + (one - beta2) * gc * gc
            dest[r, dim + c] = m
            dest[r, 2 * dim + c] = v
            dest[r, c] = w[u, c] - lr * (m / corr1) / (np.sqrt(v / corr2) + eps)
