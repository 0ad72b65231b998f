"""Spare rows ahead: the pages of a CPU slab's next unused rows are faulted in on a background
thread, off the step, so that a new row's initial values are written to memory that is there.

A dynamic vocabulary hands out slots in order, so the rows that the next batches' new IDs will
take are known before the IDs are: the ones just past the used rows. The first write to a fresh
page costs a page fault and the kernel zeroing the page: on this project's VMs 1-20 ms per 10 MB,
against about 1.5 ms for the initialisation kernel to write 40k rows of 64 values into memory
that is already mapped (``benchmarks/bench_inmemory``'s ``supply.init_new_rows`` stage).

Populating uses ``madvise(MADV_POPULATE_WRITE)`` (Linux 5.14), which maps the pages writable
without changing what they hold, so it never races with the thread that writes a row: no lock,
and no caller ever waits for it. Where the call is refused (an older kernel, another OS) the
pages are faulted in by their first write, as before. Written by hand because neither numpy nor
torch exposes it (``mmap.madvise`` needs an ``mmap`` object, and a numpy slab is not one).
"""

from __future__ import annotations

import ctypes
import mmap
import queue
import threading

import numpy as np

MADV_POPULATE_WRITE = 23
CHUNK_BYTES = 8 << 20  # one madvise call at a time: a closed slab stops within a chunk
MIN_AHEAD_BYTES = 4 << 20  # populate at least this far past the used rows
FIRST_BYTES = 256 << 20  # a budgeted slab's first rows populated when it is allocated

_jobs: queue.SimpleQueue[tuple[SpareRows, int, int]] = queue.SimpleQueue()
_worker: threading.Thread | None = None
_start_lock = threading.Lock()
_madvise = None


def _libc_madvise():
    global _madvise
    if _madvise is None:
        try:
            fn = ctypes.CDLL(None, use_errno=True).madvise
            fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            fn.restype = ctypes.c_int
            _madvise = fn
        except (OSError, AttributeError):
            _madvise = False
    return _madvise


def populate(addr: int, nbytes: int) -> bool:
    """Fault in the pages of ``[addr, addr + nbytes)`` writable, contents unchanged; False where
    the kernel refuses (the caller then lets first writes fault them in)."""
    fn = _libc_madvise()
    if not fn or nbytes <= 0:
        return False
    start = addr & ~(mmap.PAGESIZE - 1)
    return fn(start, addr + nbytes - start, MADV_POPULATE_WRITE) == 0


def _run() -> None:
    while True:
        spare, lo, hi = _jobs.get()  # (a daemon thread: it ends with the process)
        spare.populate_range(lo, hi)


def _submit(job: tuple[SpareRows, int, int]) -> None:
    global _worker
    with _start_lock:
        if _worker is None or not _worker.is_alive():
            _worker = threading.Thread(target=_run, name="cosparse-spare-rows", daemon=True)
            _worker.start()
    _jobs.put(job)


class SpareRows:
    """The spare rows of one CPU slab (rows ``used ..`` of a [capacity, width] float32 array):
    ``ahead(used, new)`` asks for the pages of the next rows, about twice the rows the last
    insert took (at least ``MIN_AHEAD_BYTES``), to be populated on the background thread."""

    def __init__(self, slab: np.ndarray) -> None:
        self.slab = slab
        self.row_bytes = slab.strides[0]
        self.frontier = 0  # rows below this were asked for already
        self.closed = False
        self.enabled = slab.flags.c_contiguous and _libc_madvise() is not False

    def ahead(self, used: int, new_rows: int) -> None:
        """After an insert left ``used`` rows in use, ``new_rows`` of them new."""
        if not self.enabled or self.closed:
            return
        want = max(2 * new_rows * self.row_bytes, MIN_AHEAD_BYTES) // self.row_bytes
        hi = min(self.slab.shape[0], used + want)
        lo = max(self.frontier, used)
        if hi <= lo:
            return
        self.frontier = hi
        _submit((self, lo, hi))

    def first(self, rows: int) -> None:
        """Populate the slab's first ``rows`` rows, at most ``FIRST_BYTES`` of them (a slab
        whose free slots are handed out in order, sized by a budget)."""
        hi = min(rows, self.slab.shape[0], max(1, FIRST_BYTES // self.row_bytes))
        if self.enabled and not self.closed and hi > self.frontier:
            lo, self.frontier = self.frontier, hi
            _submit((self, lo, hi))

    def populate_range(self, lo: int, hi: int) -> None:
        """Rows ``lo .. hi`` (on the background thread), a chunk at a time."""
        base = self.slab.ctypes.data
        per_chunk = max(1, CHUNK_BYTES // self.row_bytes)
        for start in range(lo, hi, per_chunk):
            if self.closed:
                return
            end = min(hi, start + per_chunk)
            if not populate(base + start * self.row_bytes, (end - start) * self.row_bytes):
                self.enabled = False  # refused: first writes fault the pages in, as before
                return

    def close(self) -> None:
        """The slab was replaced (grown) or dropped: queued chunks of it are skipped."""
        self.closed = True
