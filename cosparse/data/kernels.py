"""Numba kernels of the data readers: Criteo TSV chunk parsing, hex IDs and synthetic Zipf IDs.

Kernels take and return plain arrays. They run without fastmath, so results are bit-identical
across runs and processes.
"""

from __future__ import annotations

import numba
import numpy as np

NUM_INT = 13
NUM_CAT = 26
NUM_COLS = 1 + NUM_INT + NUM_CAT

# Per-line error codes of ``parse_criteo_chunk``.
ERR_OK = 0
ERR_COLUMNS = 1  # wrong number of tab-separated fields
ERR_LABEL = 2  # label is not 0 or 1
ERR_INT = 3  # integer field is not an optionally signed decimal
ERR_INT_RANGE = 4  # integer field has more than 18 digits
ERR_CAT = 5  # categorical field is not hexadecimal
ERR_CAT_RANGE = 6  # categorical field does not fit a non-negative int64

_TAB = 9
_LF = 10
_CR = 13


@numba.njit(cache=True)
def _hex_value(buf: np.ndarray, s: int, e: int) -> tuple[int, int]:
    """Parse buf[s:e] as hex. Returns (value, code) with code ERR_OK, ERR_CAT or ERR_CAT_RANGE."""
    v = 0
    for i in range(s, e):
        c = buf[i]
        if 48 <= c <= 57:
            d = c - 48
        elif 97 <= c <= 102:
            d = c - 87
        elif 65 <= c <= 70:
            d = c - 55
        else:
            return 0, ERR_CAT
        if i - s < 16:
            v = (v << 4) | d
    n = e - s
    if n > 16 or (n == 16 and v < 0):
        return 0, ERR_CAT_RANGE
    return v, ERR_OK


@numba.njit(cache=True)
def _int_value(buf: np.ndarray, s: int, e: int) -> tuple[int, int]:
    """Parse buf[s:e] as a signed decimal. Returns (value, code)."""
    i = s
    neg = False
    if buf[i] == 45 or buf[i] == 43:  # '-' or '+'
        neg = buf[i] == 45
        i += 1
    if i == e:
        return 0, ERR_INT
    v = 0
    for j in range(i, e):
        c = buf[j]
        if c < 48 or c > 57:
            return 0, ERR_INT
        if j - i < 18:
            v = v * 10 + (c - 48)
    if e - i > 18:
        return 0, ERR_INT_RANGE
    return (-v if neg else v), ERR_OK


@numba.njit(cache=True)
def parse_criteo_chunk(buf: np.ndarray, n_lines: int):  # noqa: ANN201
    """Parse ``n_lines`` Criteo TSV lines from ``buf`` (uint8; LF or CRLF endings; the last line
    may lack its newline).

    Returns (labels f32[n], ints i64[n,13], int_present bool[n,13], cats i64[n,26],
    cat_present bool[n,26], err i32[n], err_col i32[n], ncols i32[n]). ``err`` holds an ERR_* code
    per line; ``err_col`` the 0-based column of the first bad field (-1 for a column-count error).
    Values of a bad line are unspecified.
    """
    labels = np.zeros(n_lines, np.float32)
    ints = np.zeros((n_lines, NUM_INT), np.int64)
    int_present = np.zeros((n_lines, NUM_INT), np.bool_)
    cats = np.zeros((n_lines, NUM_CAT), np.int64)
    cat_present = np.zeros((n_lines, NUM_CAT), np.bool_)
    err = np.zeros(n_lines, np.int32)
    err_col = np.full(n_lines, -1, np.int32)
    ncols = np.zeros(n_lines, np.int32)
    n = buf.shape[0]
    pos = 0
    for li in range(n_lines):
        end = pos
        while end < n and buf[end] != _LF:
            end += 1
        next_pos = end + 1
        if end > pos and buf[end - 1] == _CR:
            end -= 1
        col = 0
        fs = pos
        e = ERR_OK
        ecol = -1
        while True:
            fe = fs
            while fe < end and buf[fe] != _TAB:
                fe += 1
            if e == ERR_OK and col < NUM_COLS:
                if col == 0:
                    if fe - fs == 1 and (buf[fs] == 48 or buf[fs] == 49):
                        labels[li] = buf[fs] - 48
                    else:
                        e = ERR_LABEL
                        ecol = col
                elif col <= NUM_INT:
                    if fe > fs:
                        v, code = _int_value(buf, fs, fe)
                        if code == ERR_OK:
                            ints[li, col - 1] = v
                            int_present[li, col - 1] = True
                        else:
                            e = code
                            ecol = col
                else:
                    if fe > fs:
                        v, code = _hex_value(buf, fs, fe)
                        if code == ERR_OK:
                            cats[li, col - 1 - NUM_INT] = v
                            cat_present[li, col - 1 - NUM_INT] = True
                        else:
                            e = code
                            ecol = col
            col += 1
            if fe >= end:
                break
            fs = fe + 1
        ncols[li] = col
        if col != NUM_COLS:
            e = ERR_COLUMNS
            ecol = -1
        err[li] = e
        err_col[li] = ecol
        pos = next_pos
    return labels, ints, int_present, cats, cat_present, err, err_col, ncols


@numba.njit(cache=True)
def parse_hex_strings(offsets: np.ndarray, data: np.ndarray, valid: np.ndarray):  # noqa: ANN201
    """Hex-parse an Arrow string column (int64 offsets, uint8 data, bool validity).

    Returns (values i64[n], present bool[n], code i32[n]); null and empty strings are missing.
    """
    n = valid.shape[0]
    values = np.zeros(n, np.int64)
    present = np.zeros(n, np.bool_)
    codes = np.zeros(n, np.int32)
    for i in range(n):
        s = offsets[i]
        e = offsets[i + 1]
        if not valid[i] or e == s:
            continue
        v, code = _hex_value(data, s, e)
        if code == ERR_OK:
            values[i] = v
            present[i] = True
        else:
            codes[i] = code
    return values, present, codes


# --- synthetic data -------------------------------------------------------------------------
_MASK63 = np.uint64(0x7FFFFFFFFFFFFFFF)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_W_SALT = np.uint64(0x2545F4914F6CDD1D)


@numba.njit(cache=True)
def scramble_id(rank: int, feature: int) -> int:
    """Bijective map of a Zipf rank onto [0, 2**63) for one feature (splitmix64-style on 63 bits).

    Different features add different offsets first, so their hot IDs differ.
    """
    x = (np.uint64(rank) + np.uint64(feature + 1) * _GOLDEN) & _MASK63
    x ^= x >> np.uint64(30)
    x = (x * _M1) & _MASK63
    x ^= x >> np.uint64(27)
    x = (x * _M2) & _MASK63
    x ^= x >> np.uint64(31)
    return np.int64(x)


@numba.njit(cache=True)
def hidden_weight(id_: int) -> float:
    """Deterministic N(0, 1)-like weight of an ID (Irwin-Hall of four 16-bit hash pieces)."""
    z = np.uint64(id_) ^ _W_SALT
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    z = z ^ (z >> np.uint64(31))
    s = 0.0
    for _ in range(4):
        s += float(z & np.uint64(0xFFFF)) / 65536.0
        z = z >> np.uint64(16)
    return (s - 2.0) * 1.7320508075688772  # sqrt(3): variance 4/12 -> 1


@numba.njit(cache=True)
def zipf_ids(u: np.ndarray, lengths: np.ndarray, num_features: int, batch_size: int,
             cdf: np.ndarray, guide: np.ndarray):  # noqa: ANN201
    """Map uniforms ``u`` to scrambled Zipf IDs, feature-major, bag lengths ``lengths`` [F*B].

    Inverse CDF with a guide table: ``guide[g]`` is the first rank whose cdf exceeds g/len(guide).
    Returns (values i64[len(u)], wsum f64[B]): wsum is the sum over features of the hidden weight
    of each sample's first ID.
    """
    values = np.empty(u.shape[0], np.int64)
    wsum = np.zeros(batch_size, np.float64)
    g_n = guide.shape[0]
    v_n = cdf.shape[0]
    k = 0
    for f in range(num_features):
        for b in range(batch_size):
            ln = lengths[f * batch_size + b]
            for j in range(ln):
                x = u[k]
                g = int(x * g_n)
                if g >= g_n:
                    g = g_n - 1
                r = guide[g]
                while r < v_n - 1 and cdf[r] <= x:
                    r += 1
                idv = scramble_id(r, f)
                values[k] = idv
                if j == 0:
                    wsum[b] += hidden_weight(idv)
                k += 1
    return values, wsum


@numba.njit(cache=True, nogil=True)
def take_lines(buf, starts, sel, out):
    """Copy lines ``sel`` of ``buf`` (line i is ``buf[starts[i]:starts[i + 1]]``) back to back
    into ``out``, in the order of ``sel``; returns the bytes written."""
    o = 0
    for j in range(sel.shape[0]):
        a, b = starts[sel[j]], starts[sel[j] + 1]
        out[o:o + b - a] = buf[a:b]
        o += b - a
    return o
