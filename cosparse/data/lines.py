"""Text files as line chunks: open plain or gzip files, count lines, cut chunks of N raw lines.

Nothing here parses a line. Chunks are cut at newline positions found with numpy over large blocks,
so skipping lines (train/eval split, resume) costs a read, never a parse.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from cosparse.data.errors import DataError
from cosparse.data.kernels import take_lines

BLOCK_BYTES = 4 << 20
_GZIP_MAGIC = b"\x1f\x8b"


def is_gzip(path: str | Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == _GZIP_MAGIC


def open_binary(path: str | Path) -> BinaryIO:
    """Open ``path`` for binary reading, decompressing gzip (detected by magic bytes).

    A missing file raises DataError naming the path.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: data file not found")
    if is_gzip(p):
        return gzip.open(p, "rb")  # type: ignore[return-value]
    return open(p, "rb", buffering=0)


def read_blocks(path: str | Path, block_bytes: int = BLOCK_BYTES) -> Iterator[bytes]:
    """Raw (decompressed) blocks of ``path``. A truncated or corrupt gzip raises DataError."""
    with open_binary(path) as f:
        while True:
            try:
                b = f.read(block_bytes)
            except (EOFError, OSError, zlib.error) as e:
                raise DataError(f"{path}: gzip file is truncated or corrupt ({e})") from e
            if not b:
                return
            yield b


_COUNT_CACHE: dict[tuple[str, int, int], int] = {}


def count_lines(path: str | Path) -> int:
    """Number of lines, counting a final line without newline. Cached per (path, size, mtime)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: data file not found")
    st = os.stat(p)
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    n = _COUNT_CACHE.get(key)
    if n is None:
        n = 0
        last = b"\n"
        for b in read_blocks(p):
            n += b.count(b"\n")
            last = b[-1:]
        if last != b"\n":
            n += 1
        _COUNT_CACHE[key] = n
    return n


def line_chunks(
    path: str | Path,
    first_line: int,
    num_lines: int,
    chunk_lines: int,
    block_bytes: int = BLOCK_BYTES,
) -> Iterator[tuple[int, int, bytes]]:
    """Yield (first line number, line count, raw bytes) for consecutive chunks of ``chunk_lines``
    lines, covering lines ``first_line`` .. ``first_line + num_lines - 1`` (1-based) of ``path``.

    Lines before ``first_line`` are skipped unparsed. The last chunk may be shorter; it also ends
    early when the file does. Every chunk's bytes end in a newline except possibly the file's last.
    """
    if chunk_lines <= 0:
        raise ValueError("chunk_lines must be positive")
    if num_lines <= 0:
        return
    skip = first_line - 1
    remaining = num_lines
    line_no = first_line
    pending: list[bytes] = []  # bytes of the current chunk (or skipped prefix) so far
    pending_lines = 0  # complete lines in ``pending``

    def want() -> int:
        return skip if skip > 0 else min(chunk_lines, remaining)

    for block in read_blocks(path, block_bytes):
        nls = np.flatnonzero(np.frombuffer(block, np.uint8) == 10)
        start = 0
        j = 0
        while remaining > 0:
            need = want() - pending_lines
            if len(nls) - j < need:
                break
            end = int(nls[j + need - 1]) + 1
            j += need
            if skip > 0:
                skip = 0
                pending = []
            else:
                pending.append(block[start:end])
                n = pending_lines + need
                yield line_no, n, b"".join(pending)
                line_no += n
                remaining -= n
                pending = []
            pending_lines = 0
            start = end
        if remaining <= 0:
            return
        if skip > 0:
            pending_lines += len(nls) - j  # skipped bytes are never kept
        else:
            pending.append(block[start:])
            pending_lines += len(nls) - j
    # end of file: a final chunk of what is left, plus a last line without newline
    if skip > 0 or remaining <= 0:
        return
    data = b"".join(pending)
    n = pending_lines + (1 if data and not data.endswith(b"\n") else 0)
    n = min(n, remaining)
    if n > 0:
        yield line_no, n, data



class LineBlock:
    """Lines read together (each ending in a newline), from which any of them are taken in any
    order: the shuffle's windows and the split's rows are cut from one read this way."""

    def __init__(self, chunks: list[bytes]) -> None:
        joined = b"".join(c if c.endswith(b"\n") else c + b"\n" for c in chunks if c)
        self.buf = np.frombuffer(joined, np.uint8)
        ends = np.flatnonzero(self.buf == 10) + 1
        self.starts = np.concatenate([np.zeros(1, np.int64), ends.astype(np.int64)])

    @property
    def num_lines(self) -> int:
        return len(self.starts) - 1

    def take(self, sel: np.ndarray) -> bytes:
        """Lines ``sel`` (0-based within the block), in that order, as one bytes."""
        sel = np.ascontiguousarray(sel, np.int64)
        out = np.empty(int((self.starts[sel + 1] - self.starts[sel]).sum()), np.uint8)
        take_lines(self.buf, self.starts, sel, out)
        return out.tobytes()
