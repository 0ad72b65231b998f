"""Plain data of the embedding layer: a prepared (and staged) batch, and unpooled rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cosparse.batch import SparseBatch
from cosparse.store.dedup import TableIds


@dataclass
class Jagged:
    """One unpooled feature: ``values`` [n, dim], the rows of sample ``s`` at
    ``values[offsets[s]:offsets[s + 1]]``; ``lengths`` [B] and ``offsets`` [B + 1] int64."""

    values: torch.Tensor
    lengths: torch.Tensor
    offsets: torch.Tensor

    @property
    def batch_size(self) -> int:
        return int(self.lengths.shape[0])


@dataclass
class PreparedBatch:
    """A batch plus the ID work of each of its tables, and (once staged) their device slots."""

    batch: SparseBatch
    tables: dict[str, TableIds]
    prep_ms: float = 0.0
    slots: dict[str, np.ndarray] | None = None
    plan_ms: float = 0.0  # planning, filling included
    fill_ms: float = 0.0  # bringing the misses' rows in
    prep_at: float = 0.0  # perf_counter when the ID work started (the step records' spans)
    plan_at: float = 0.0  # ... when planning started
    # what planning this batch did, summed over its tables: unique IDs looked up, device misses,
    # device rows evicted, lookahead shrinks (the step records' counters)
    plan_stats: dict[str, int] | None = None
    # many ranks (``cosparse.parallel``): the rank's own shards' prepared global batch and the
    # batch's input distribution, which the sharded collection reads
    shard: Any = None
