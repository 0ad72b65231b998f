"""numba kernels of the event-log reader: parse ``user,item,category,behaviour,timestamp`` CSV
lines, and gather each sample's jagged behaviour sequence (most recent event first)."""

from __future__ import annotations

import numba
import numpy as np

NUM_COLS = 5
COLUMNS = ("user_id", "item_id", "category_id", "behavior_type", "timestamp")
BEHAVIOURS = ("pv", "cart", "fav", "buy")  # behaviour code = position here

ERR_OK = 0
ERR_COLUMNS = 1  # wrong number of fields
ERR_INT = 2  # a non-numeric (or empty) integer field
ERR_RANGE = 3  # an integer field over 18 digits
ERR_BEHAVIOUR = 4  # a behaviour that is not pv, cart, fav or buy

_MAX_DIGITS = 18


@numba.njit(cache=True)
def count_lines(buf):
    """Lines in ``buf`` (a last line without a newline counts)."""
    n = 0
    for i in range(buf.shape[0]):
        if buf[i] == 10:
            n += 1
    if buf.shape[0] > 0 and buf[buf.shape[0] - 1] != 10:
        n += 1
    return n


@numba.njit(cache=True)
def _behaviour(buf, a, b):
    """Behaviour code of ``buf[a:b]``, -1 when unknown."""
    n = b - a
    if n == 2 and buf[a] == 112 and buf[a + 1] == 118:  # pv
        return 0
    if n == 4 and buf[a] == 99 and buf[a + 1] == 97 and buf[a + 2] == 114 and buf[a + 3] == 116:
        return 1  # cart
    if n == 3 and buf[a] == 102 and buf[a + 1] == 97 and buf[a + 2] == 118:  # fav
        return 2
    if n == 3 and buf[a] == 98 and buf[a + 1] == 117 and buf[a + 2] == 121:  # buy
        return 3
    return -1


@numba.njit(cache=True)
def parse_events(buf, n_lines, out_cols, out_btag, out_err, out_err_col, out_ncols):
    """Parse ``n_lines`` lines of ``buf`` into ``out_cols`` int64 [n, 4] (user, item, category,
    timestamp) and ``out_btag`` int8 [n]; per line an error code, the bad column and the field
    count. Returns the number of lines parsed."""
    n = buf.shape[0]
    pos = 0
    line = 0
    while pos < n and line < n_lines:
        end = pos
        while end < n and buf[end] != 10:
            end += 1
        stop = end
        if stop > pos and buf[stop - 1] == 13:
            stop -= 1
        # field count first
        nf = 1
        for i in range(pos, stop):
            if buf[i] == 44:
                nf += 1
        out_ncols[line] = nf
        err = ERR_OK
        col_bad = -1
        if nf != NUM_COLS:
            err = ERR_COLUMNS
        else:
            a = pos
            for col in range(NUM_COLS):
                b = a
                while b < stop and buf[b] != 44:
                    b += 1
                if col == 3:
                    code = _behaviour(buf, a, b)
                    if code < 0:
                        err = ERR_BEHAVIOUR
                        col_bad = col
                        break
                    out_btag[line] = code
                else:
                    if b == a:
                        err = ERR_INT
                        col_bad = col
                        break
                    if b - a > _MAX_DIGITS:
                        err = ERR_RANGE
                        col_bad = col
                        break
                    v = 0
                    ok = True
                    for i in range(a, b):
                        c = buf[i]
                        if c < 48 or c > 57:
                            ok = False
                            break
                        v = v * 10 + (c - 48)
                    if not ok:
                        err = ERR_INT
                        col_bad = col
                        break
                    out_cols[line, col if col < 3 else 3] = v
                a = b + 1
        out_err[line] = err
        out_err_col[line] = col_bad
        line += 1
        pos = end + 1
    return line


def empty_outputs(n: int) -> tuple[np.ndarray, ...]:
    """Output arrays of ``parse_events`` for ``n`` lines."""
    return (np.zeros((n, 4), np.int64), np.zeros(n, np.int8), np.zeros(n, np.int8),
            np.full(n, -1, np.int8), np.zeros(n, np.int32))
