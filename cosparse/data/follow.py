"""Following a streamed text file as it grows: the byte offset consumed, and the proof that the
consumed prefix is unchanged (``data.stream``).

A line file (CSV) of a stream is read by byte offset: each time it is taken, only the whole lines
past the offset consumed so far are read (a last line without its newline waits until it is
complete), and the offset moves to the end of the last whole line. A ``FileMark`` keeps the
offset, the rows before it and a digest of the prefix's first and last ``DIGEST_BLOCK`` bytes; a
file that shrank below its offset, or whose digested prefix changed, was truncated or rewritten:
``check_prefix`` refuses it, naming the file (rows trained from it cannot be taken back).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from cosparse.data.errors import DataError

DIGEST_BLOCK = 4096
_READ_BYTES = 1 << 20


@dataclass(frozen=True)
class FileMark:
    """How far a file was consumed: ``offset`` bytes holding ``rows`` rows (the header not
    counted), whose first and last ``DIGEST_BLOCK`` bytes digest to ``digest``."""

    offset: int
    rows: int
    digest: str

    def to_json(self) -> list:
        return [self.offset, self.rows, self.digest]

    @staticmethod
    def from_json(v: list) -> FileMark:
        return FileMark(int(v[0]), int(v[1]), str(v[2]))


def _pread(fd: int, n: int, at: int) -> bytes:
    out = b""
    while len(out) < n:
        b = os.pread(fd, n - len(out), at + len(out))
        if not b:
            break
        out += b
    return out


def prefix_digest(path: str, offset: int) -> str:
    """The digest of ``path``'s first and last ``DIGEST_BLOCK`` bytes before ``offset``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        head = _pread(fd, min(offset, DIGEST_BLOCK), 0)
        tail_at = max(0, offset - DIGEST_BLOCK)
        tail = _pread(fd, offset - tail_at, tail_at)
    finally:
        os.close(fd)
    return hashlib.blake2b(head + b"|" + tail, digest_size=16).hexdigest()


def check_prefix(path: str, mark: FileMark) -> None:
    """Refuse (DataError naming ``path``) a file truncated below, or rewritten before, the
    offset ``mark`` consumed."""
    size = os.stat(path).st_size
    if size < mark.offset:
        raise DataError(f"data.stream: {path} was truncated: it holds {size:,} bytes, but its "
                        f"first {mark.offset:,} bytes ({mark.rows:,} rows) were already trained; "
                        "a streamed file may only grow by appended lines (write new rows to "
                        "a new file)")
    if prefix_digest(path, mark.offset) != mark.digest:
        raise DataError(f"data.stream: {path} was rewritten: its first {mark.offset:,} bytes "
                        f"({mark.rows:,} rows), already trained, changed; a streamed file may "
                        "only grow by appended lines (write new rows to a new file)")


def complete_end(path: str, lo: int) -> int:
    """The offset just past the last newline of ``path`` at or after ``lo`` (``lo`` when no
    whole line follows it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        hi = os.fstat(fd).st_size
        while hi > lo:
            at = max(lo, hi - _READ_BYTES)
            block = _pread(fd, hi - at, at)
            k = block.rfind(b"\n")
            if k >= 0:
                return at + k + 1
            hi = at
    finally:
        os.close(fd)
    return lo


def skip_lines(path: str, lo: int, hi: int, n: int) -> int:
    """The offset after the first ``n`` lines from ``lo`` (``hi`` at most)."""
    if n <= 0:
        return lo
    for _, end in line_batches(path, lo, hi, n):
        return end
    return lo


def line_batches(path: str, lo: int, hi: int, lines: int) -> Iterator[tuple[bytes, int]]:
    """(bytes, end offset) of consecutive runs of ``lines`` whole lines of ``path`` in
    [``lo``, ``hi``) (``hi`` just past a newline); the last run may be shorter."""
    fd = os.open(path, os.O_RDONLY)
    try:
        pending: list[bytes] = []
        have, at = 0, lo
        while at < hi:
            block = _pread(fd, min(_READ_BYTES, hi - at), at)
            if not block:
                raise DataError(f"data.stream: {path} was truncated while it was read "
                                f"(at byte {at:,} of {hi:,})")
            nls = np.flatnonzero(np.frombuffer(block, np.uint8) == 10)
            start, j = 0, 0
            while len(nls) - j >= lines - have:
                end = int(nls[j + lines - have - 1]) + 1
                j += lines - have
                pending.append(block[start:end])
                yield b"".join(pending), at + end
                pending, have, start = [], 0, end
            pending.append(block[start:])
            have += len(nls) - j
            at += len(block)
        if have:
            yield b"".join(pending), hi
    finally:
        os.close(fd)


def count_newlines(path: str, lo: int, hi: int) -> int:
    """The newlines of ``path`` in [``lo``, ``hi``)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        n, at = 0, lo
        while at < hi:
            block = _pread(fd, min(_READ_BYTES, hi - at), at)
            if not block:
                break
            n += block.count(b"\n")
            at += len(block)
        return n
    finally:
        os.close(fd)
