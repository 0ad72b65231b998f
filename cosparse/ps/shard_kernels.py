"""Fused numba kernels of a parameter-server shard: one call per PULL and one per PUSH request.

Why hand-written: before these, a request made many passes over its IDs, each a numpy or numba
call with Python in between: the owner check (``shard_of``), the hash lookup, ``np.unique`` of
the new IDs, their insertion, their initial rows, a second lookup, the gather into a buffer, a
column slice copy for the reply, the optimizer over the gathered buffer, the version bumps, the
dirty flags, ``np.unique`` again to refuse duplicate pushed IDs, ``np.isfinite`` over the
gradients. At 1k to 8k rows per request the fixed costs and the temporaries were most of a
shard's CPU. Here a request is one kernel call that reads each ID and each row once or twice.

The store they work on is a ``ShardTable``'s (``cosparse.ps.shard_table``):

* ``keys`` int64 / ``vals`` int32 [cap, a power of two]: the ID -> slot map, open addressing
  with linear probing and the same hashing as ``cosparse.store.kernels`` (-1: empty bucket);
* ``slab`` float32 [rows_cap, width]: each row's values, then its optimizer state;
* ``versions`` int64, ``flags`` uint8 [rows_cap]: each row's version (bumped on every write),
  and ``DIRTY`` (not in the last snapshot) plus ``SEEN`` (only while a push runs: its duplicate
  check).

No array maps a slot back to its ID: the map holds that pair already, and only a snapshot or a
dump needs the reverse (``slot_keys``, one pass over the map). A request's new IDs go to a
per-request scratch (``new_ids``), where their initialisation and a rollback find them.

Rows are never removed, so the live slots are ``0 .. size-1`` in insertion order; a kernel that
adds rows returns the new ``size``. A refused request leaves everything as it was: the IDs it
inserted are erased again before the kernel returns.

Exactness: a new row is ``cosparse.store.kernels.rows.init_row`` (the arithmetic of
``init_rows``: the pure function of (table seed, ID) every placement uses), and a pushed row
runs ``cosparse.optim.kernels.update_row``, the row function the all-resident engine's optimizer
kernels run, on the slab in place. Each row is
written by one thread whatever the thread count (``parallel`` variants split the rows of a
request between threads; the map is written by one thread), so results are bit-identical to the
all-resident engine's.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from cosparse.optim.kernels import ROWWISE_ADAGRAD, row_finite, rowwise_adagrad_4, update_row
from cosparse.store.kernels.hashing import EMPTY, erase_at, first_empty, mix64, probe, probe_hashed
from cosparse.store.kernels.rows import init_row, init_seed
from cosparse.store.kernels.variants import variant

DIRTY = np.uint8(1)
SEEN = np.uint8(2)
NOT_SEEN = np.uint8(0xFD)

# kernel status codes (what the caller turns into an error)
OK = 0
FOREIGN = 1  # an ID this shard does not own
NOT_FINITE = 2  # a pushed gradient row with NaN or infinity (the first one's index: ``at``)
DUPLICATE = 3  # a pushed ID that occurs twice (the second occurrence's index: ``at``)
FULL = 4  # more new rows than the budget (``limit``) allows
ROOM = 5  # the map or the row arrays must grow first (the caller grows them, then calls again)
NOT_FINITE_RESULT = 6  # a pushed row whose new values or state would be NaN or infinite (``at``)


PREFETCH_AHEAD = 8  # rows (or IDs) ahead that a pass asks the CPU to fetch


@intrinsic
def prefetch(typingctx, arr, index):  # noqa: ANN001, ANN201 - a numba intrinsic
    """Ask the CPU to fetch the cache line of ``arr.flat[index]`` (1-D or C-contiguous 2-D
    ``arr``; ``llvm.prefetch``, a hint that changes no value). The shard's tables are far larger
    than the caches, so each row and map bucket a request touches is a miss; fetching a few
    ahead overlaps those misses."""
    sig = types.void(arr, index)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = builder.gep(ary.data, [args[1]])
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        # (address, read 0 / write 1: write, locality 3: keep in every cache level, data cache)
        builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 1), ir.Constant(i32, 3),
                          ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(inline="always")
def prefetch_row(slab, r):
    """Every cache line of ``slab[r]`` (a C-contiguous 2-D array)."""
    width = slab.shape[1]
    first = r * width
    for off in range(0, width, 16):  # 16 float32 per 64-byte line
        prefetch(slab, first + off)
    prefetch(slab, first + width - 1)


@numba.njit(inline="always")
def _rollback(keys, vals, new_ids, count):
    """Erase ``new_ids[:count]`` from the map (a refused request's inserts)."""
    mask = np.uint64(keys.shape[0] - 1)
    for j in range(count):
        k = new_ids[j]
        b, _ = probe(keys, vals, k, mask)
        erase_at(keys, vals, b, mask)


@numba.njit(inline="always")
def _lookup(keys, vals, ids, shard, num_shards, grads, slots, marks):
    """Pass 1 (parallel over IDs, the map only read): ``slots[i]`` (-1: absent) and ``marks[i]``
    (bit 0: not this shard's ID; bit 1: a gradient row that is not finite, when ``grads`` has
    rows). Returns whether any ID was marked."""
    mask = np.uint64(keys.shape[0] - 1)
    nsh = np.uint64(num_shards)
    check_grads = grads.shape[0] > 0
    bad = 0
    n = ids.shape[0]
    for i in prange(n):
        if i + PREFETCH_AHEAD < n:
            ha = np.int64(mix64(np.uint64(ids[i + PREFETCH_AHEAD])) & mask)
            prefetch(keys, ha)
            prefetch(vals, ha)
        k = ids[i]
        h = mix64(np.uint64(k))
        m = 0
        if num_shards > 1 and np.int64(h % nsh) != shard:
            m = 1
        if check_grads:
            for c in range(grads.shape[1]):
                if not np.isfinite(grads[i, c]):
                    m |= 2
                    break
        marks[i] = m
        bad += m
        _, v = probe_hashed(keys, vals, k, h, mask)
        slots[i] = v
    return bad > 0


@numba.njit(inline="always")
def _insert_missing(keys, vals, new_ids, size, ids, slots, limit, room):
    """Pass 2 (serial): give each absent ID a new slot ``size, size+1, ...`` (a duplicate of a new
    ID gets the same one), the ID of slot ``size0 + j`` in ``new_ids[j]``. Returns (new size,
    status): ``FULL`` past ``limit`` slots, ``ROOM`` past ``room`` (both with nothing inserted)."""
    mask = np.uint64(keys.shape[0] - 1)
    size0 = size
    for i in range(ids.shape[0]):
        if slots[i] >= 0:
            continue
        k = ids[i]
        b, v = probe(keys, vals, k, mask)
        if v == EMPTY:
            if size >= limit or size >= room:
                _rollback(keys, vals, new_ids, size - size0)
                return size0, FULL if size >= limit else ROOM
            keys[b] = k
            vals[b] = size
            new_ids[size - size0] = k
            v = size
            size += 1
        slots[i] = v
    return size, OK


@numba.njit(inline="always")
def _init_new(slab, new_ids, versions, flags, size0, size, seed, dim, init_kind, a, b, state0,
              col0, flag):
    """New rows ``size0 .. size-1`` (IDs ``new_ids``): their initial value from (seed, ID),
    version 0, ``flags``."""
    s64 = init_seed(seed)
    for s in prange(size0, size):
        init_row(slab, s, new_ids[s - size0], s64, dim, init_kind, a, b, state0, col0)
        versions[s] = 0
        flags[s] = flag


@numba.njit(inline="always")
def _copy_row(src, r, dst, i):
    """``dst[i] = src[r]`` (a plain loop: a slice assignment costs more in a kernel this hot)."""
    for c in range(src.shape[1]):
        dst[i, c] = src[r, c]


@numba.njit(inline="always")
def _first_mark(marks, bit):
    for i in range(marks.shape[0]):
        if marks[i] & bit:
            return i
    return -1


def _pull(keys, vals, new_ids, slab, versions, flags, size, ids, shard, num_shards, create,
          limit, room, seed, dim, init_kind, a, b, state0, col0, out_rows, out_versions, slots,
          marks):
    """One PULL: ``out_rows[i] = slab[slot of ids[i], :out_rows.shape[1]]`` and its version.

    ``create``: absent IDs get new rows (version 0, dirty), their initial value from (seed, ID);
    otherwise (a peek) they read that initial value with version -1 and nothing changes.
    Returns (new size, status, index)."""
    empty = np.empty((0, 1), dtype=np.float32)
    if _lookup(keys, vals, ids, shard, num_shards, empty, slots, marks):
        return size, FOREIGN, _first_mark(marks, 1)
    size0 = size
    if create:
        size, status = _insert_missing(keys, vals, new_ids, size, ids, slots, limit, room)
        if status != OK:
            return size, status, -1
        _init_new(slab, new_ids, versions, flags, size0, size, seed, dim, init_kind, a, b,
                  state0, col0, DIRTY)
    cols = out_rows.shape[1]
    missing = 0
    n = ids.shape[0]
    for i in prange(n):
        if i + PREFETCH_AHEAD < n and slots[i + PREFETCH_AHEAD] >= 0:
            ra = slots[i + PREFETCH_AHEAD]
            prefetch_row(slab, ra)
            prefetch(versions, ra)
        s = slots[i]
        if s < 0:
            out_versions[i] = -1
            missing += 1
        else:
            for c in range(cols):
                out_rows[i, c] = slab[s, c]
            out_versions[i] = versions[s]
    if missing > 0:  # a peek at absent IDs: their initial values, nothing created
        s64 = init_seed(seed)
        for i in range(ids.shape[0]):
            if slots[i] < 0:
                init_row(out_rows, i, ids[i], s64, dim, init_kind, a, b, state0, col0)
    return size, OK, -1


def _push(keys, vals, new_ids, slab, versions, flags, size, ids, grads, shard, num_shards,
          limit, room, seed, dim, init_kind, a, b, state0, col0, kind, lr, eps, l2, beta1, beta2,
          corr1, corr2, slots, marks, undo):
    """One PUSH: the optimizer rule ``kind`` on the row of each (unique) ``ids[i]`` with
    ``grads[i]``, in place; each row's version + 1, dirty. Absent IDs get their initial row first.
    Refused, with nothing changed: a foreign ID, a non-finite gradient row, a duplicate ID, more
    new rows than ``limit`` allows (in that order), and a row whose new values or state would be
    NaN or infinite (``NOT_FINITE_RESULT``: every row is put back from ``undo`` [n, width], its
    copy taken just before its update). Returns (new size, status, index)."""
    if _lookup(keys, vals, ids, shard, num_shards, grads, slots, marks):
        i = _first_mark(marks, 1)
        if i >= 0:
            return size, FOREIGN, i
        return size, NOT_FINITE, _first_mark(marks, 2)
    size0 = size
    size, status = _insert_missing(keys, vals, new_ids, size, ids, slots, limit, room)
    if status != OK:
        return size, status, -1
    for i in range(ids.shape[0]):  # duplicates: a slot seen twice
        s = slots[i]
        if flags[s] & SEEN:
            for j in range(i):
                flags[slots[j]] = flags[slots[j]] & NOT_SEEN
            _rollback(keys, vals, new_ids, size - size0)
            return size0, DUPLICATE, i
        flags[s] = flags[s] | SEEN
    _init_new(slab, new_ids, versions, flags, size0, size, seed, dim, init_kind, a, b, state0,
              col0, 0)
    n = ids.shape[0]
    width = slab.shape[1]
    bad = 0
    if kind == ROWWISE_ADAGRAD:  # four rows at a time (each row's arithmetic unchanged)
        quads = n // 4
        for q in prange(quads):
            for j in range(4 * q + 2 * PREFETCH_AHEAD, min(4 * q + 2 * PREFETCH_AHEAD + 4, n)):
                prefetch_row(slab, slots[j])
            for j in range(4 * q, 4 * q + 4):
                _copy_row(slab, slots[j], undo, j)
            r0, r1, r2, r3 = slots[4 * q], slots[4 * q + 1], slots[4 * q + 2], slots[4 * q + 3]
            rowwise_adagrad_4(slab, slab, dim, r0, r1, r2, r3, grads, 4 * q, slab, r0, r1, r2, r3,
                              dim, lr, eps, l2)
            for j in range(4 * q, 4 * q + 4):
                if not row_finite(slab, slots[j], width):
                    marks[j] = 4
                    bad += 1
        first = 4 * quads
    else:
        first = 0
    for i in prange(first, n):
        r = slots[i]
        if i + PREFETCH_AHEAD < n:
            prefetch_row(slab, slots[i + PREFETCH_AHEAD])
        _copy_row(slab, r, undo, i)
        update_row(kind, slab, slab, dim, r, grads, i, slab, r, dim, lr, eps, l2, beta1, beta2,
                   corr1, corr2)
        if not row_finite(slab, r, width):
            marks[i] = 4
            bad += 1
    if bad > 0:  # all or nothing: every row back as it was, the new IDs out of the map
        for i in prange(n):
            slab[slots[i], :] = undo[i]
            flags[slots[i]] = flags[slots[i]] & NOT_SEEN
        _rollback(keys, vals, new_ids, size - size0)
        return size0, NOT_FINITE_RESULT, _first_mark(marks, 4)
    for i in prange(n):
        r = slots[i]
        versions[r] += 1
        flags[r] = DIRTY
    return size, OK, -1


def _find_or_add(keys, vals, new_ids, slab, versions, flags, size, ids, create, limit, room,
                 seed, dim, init_kind, a, b, state0, col0, slots):
    """Slots of ``ids`` (-1: absent), adding the absent ones as new rows (version 0, dirty) when
    ``create``: the lookup of a PUSH_ROWS or a restore. Returns (new size, status)."""
    empty = np.empty((0, 1), dtype=np.float32)
    marks = np.empty(ids.shape[0], dtype=np.uint8)
    _lookup(keys, vals, ids, 0, 1, empty, slots, marks)
    if not create:
        return size, OK
    size0 = size
    size, status = _insert_missing(keys, vals, new_ids, size, ids, slots, limit, room)
    if status == OK:
        _init_new(slab, new_ids, versions, flags, size0, size, seed, dim, init_kind, a, b,
                  state0, col0, DIRTY)
    return size, status


# serial variants (one thread: no parallel region to start per request), and parallel ones for
# ``ps serve --shard-threads N`` with N > 1 (the passes above are inlined into each)

pull_serial = variant(_pull, "pull_serial", nogil=True)
pull_parallel = variant(_pull, "pull_parallel", nogil=True, parallel=True)
push_serial = variant(_push, "push_serial", nogil=True)
push_parallel = variant(_push, "push_parallel", nogil=True, parallel=True)
find_or_add = variant(_find_or_add, "find_or_add", nogil=True)


@numba.njit(cache=True, nogil=True)
def slot_keys(keys, vals, out) -> None:
    """``out[slot] = ID`` for every entry of the map (``out``: one per live slot)."""
    for i in range(keys.shape[0]):
        v = vals[i]
        if v != EMPTY:
            out[v] = keys[i]


@numba.njit(cache=True, nogil=True)
def rehash(old_keys, old_vals, new_keys, new_vals) -> None:
    """Re-insert every entry of the old map into the (larger, empty) new one."""
    mask = np.uint64(new_keys.shape[0] - 1)
    for i in range(old_keys.shape[0]):
        v = old_vals[i]
        if v == EMPTY:
            continue
        k = old_keys[i]
        bk = first_empty(new_vals, k, mask)
        new_keys[bk] = k
        new_vals[bk] = v
