"""Numba kernels of the blocked Bloom filter: one 64-bit word per key, ``k`` bits in it."""

from __future__ import annotations

import numba
import numpy as np

from cosparse.store.kernels import mix64

_SALT = np.uint64(0x5BD1E9955BD1E995)


@numba.njit(inline="always")
def _word_and_mask(key: np.int64, n_words: np.uint64, k: np.int64) -> tuple[np.int64, np.uint64]:
    """The word of ``key`` and its ``k`` bits, all from one 64-bit mix: the word from the high
    32 bits by a multiply and shift (``n_words`` < 2**32; no division), bit ``j`` from bits
    ``6j .. 6j+5`` of the low half (``k`` <= 5)."""
    h = mix64(np.uint64(key) ^ _SALT)
    w = np.int64(((h >> np.uint64(32)) * n_words) >> np.uint64(32))
    m = np.uint64(0)
    for j in range(k):
        m |= np.uint64(1) << ((h >> np.uint64(6 * j)) & np.uint64(63))
    return w, m


@numba.njit(cache=True, nogil=True)
def bloom_add(words, ids, k):
    """Set the bits of every ID (serial: two IDs may share a word)."""
    n = np.uint64(words.shape[0])
    for i in range(ids.shape[0]):
        w, m = _word_and_mask(ids[i], n, k)
        words[w] |= m


@numba.njit(cache=True, nogil=True)
def bloom_contains(words, ids, k, out):
    """out[i] = the filter may hold ids[i] (no false negatives). Serial: it runs in data
    workers, one core each."""
    n = np.uint64(words.shape[0])
    for i in range(ids.shape[0]):
        w, m = _word_and_mask(ids[i], n, k)
        out[i] = (words[w] & m) == m
