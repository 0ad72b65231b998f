"""What a parameter-server shard accepts from its clients (``ShardLimits``, ``cosparse ps serve
--max-*``) and the error for a request it refuses (``ShardError``, with the kind of refusal that
the server maps to a wire error code)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from cosparse.ps.protocol import SMALL_REQUEST_ROWS


class ShardError(ValueError):
    """A request the shard refuses (unknown table, foreign IDs, bad shapes)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # "table" | "owner" | "request" | "limit" | "full" | "quota" | "denied"
        # | "nonfinite"


def default_max_bytes() -> int:
    """The default byte budget of a shard (``ps serve --max-bytes``): half this machine's physical
    memory, at least 1 GiB. A shard rarely has its host to itself (embedded shards share it with
    each other and the trainer), and a budget larger than the memory only turns a clear refusal
    into swapping or the OOM killer; half of 24 GiB still holds the benchmarks (8 tables of 1M
    rows at dim 64 over 2 shards: 1.2 GB per shard with row-wise Adagrad, 3.3 GB with Adam)."""
    try:
        phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not on every platform: a fixed 8 GiB
        phys = 16 << 30
    return max(1 << 30, phys // 2)


@dataclass(frozen=True)
class ShardLimits:
    """What one shard accepts from its clients (``cosparse ps serve --max-*``).

    The defaults leave room for the benchmarks (8 tables of 1M rows over 2 shards, batches of
    4096) and bound what one request or one client can make a shard allocate. ``max_bytes``
    counts what rows cost (``shard_table.row_bytes``: values, optimizer state, version, flags and
    their share of the ID map), so a wide table cannot take terabytes within the row budget.
    """

    max_rows: int = 1 << 27  # rows of every table together (the row budget)
    max_bytes: int = field(default_factory=default_max_bytes)  # their bytes (the byte budget)
    max_request_rows: int = 1 << 20  # IDs in one PULL, PUSH or PUSH_ROWS
    max_dim: int = 4096  # a table's embedding width
    max_tables: int = 256

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{f.name} (ps serve --{f.name.replace('_', '-')}): must be a "
                                 f"positive integer, got {v!r}")
        if self.max_request_rows < SMALL_REQUEST_ROWS:  # clients send that many without asking
            raise ValueError(f"max_request_rows (ps serve --max-request-rows): at least "
                             f"{SMALL_REQUEST_ROWS}, got {self.max_request_rows}")
