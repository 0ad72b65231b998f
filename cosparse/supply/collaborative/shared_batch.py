"""Arrays packed into one shared-memory file: how a batch and its delivered rows travel from a
data worker to the trainer without pickling.

The worker writes every array into a file in a shared-memory directory (``/dev/shm`` where
there is one; its name carries the trainer's owner tag) and sends only the file name and the
layout (names, dtypes, shapes, offsets). The trainer maps the file copy-on-write, takes numpy
views (no copy), and unlinks the file at once: the mapping lives until the last view is dropped.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

_ALIGN = 64

Layout = list[tuple[str, str, tuple[int, ...], int]]  # (name, dtype, shape, offset)


def write_arrays(path: str | Path, arrays: dict[str, np.ndarray]) -> tuple[Layout, int]:
    """Write ``arrays`` into a new file at ``path``; returns (layout, bytes of array data)."""
    layout: Layout = []
    offset = 0
    payload = 0
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        layout.append((name, a.dtype.str, tuple(a.shape), offset))
        offset += (a.nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
        payload += a.nbytes
    size = max(offset, 1)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size) as mm:
            for (_, _, _, off), a in zip(layout, arrays.values(), strict=True):
                a = np.ascontiguousarray(a)
                if a.nbytes:
                    mm[off : off + a.nbytes] = a.reshape(-1).view(np.uint8).data
    finally:
        os.close(fd)
    return layout, payload


def read_arrays(path: str | Path, layout: Layout) -> dict[str, np.ndarray]:
    """Map ``path`` copy-on-write, unlink it, and return writable views of its arrays."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)
        os.unlink(path)
    out = {}
    for name, dtype, shape, off in layout:
        dt = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        out[name] = np.frombuffer(mm, dtype=dt, count=count, offset=off).reshape(shape)
    return out
