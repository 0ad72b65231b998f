"""The sharding planner's statistics of each table, measured on the first batches of a reader."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cosparse.batch import SparseBatch
from cosparse.config import TableConfig
from cosparse.optim import SparseOptimizer
from cosparse.parallel.growth import distinct_curve, predicted_rows
from cosparse.parallel.types import TableStats
from cosparse.store.dedup import map_ids, table_parts

# a table's hotness curve (``TableStats.hotness``) from each batch's distinct row keys
Hotness = Callable[[TableConfig, list[np.ndarray]], tuple[tuple[float, float, float], ...]]


def table_stats(tables: list[TableConfig], batches: list[SparseBatch],
                hotness: Hotness | None = None, steps: int | None = None
                ) -> dict[str, TableStats]:
    """Per table: IDs per sample, distinct rows per batch, and its rows: ``num_embeddings``
    when given (its slab holds that many from the start), else the distinct rows a run of
    ``steps`` batches will hold, extrapolated from the batches' vocabulary growth (None: the
    batches' own distinct rows, a lower bound) and at most ``hash_size``; ``hotness`` (the
    capacity planner's, injected): its hotness curve."""
    out = {}
    samples = max(1, sum(b.batch_size for b in batches))
    for t in tables:
        seen, ids_total, uniques = [], 0, []
        for b in batches:
            ids, _ = table_parts(b, t.features)
            keys = map_ids(ids, t.hash_size)
            ids_total += keys.shape[0]
            u = np.unique(keys)
            uniques.append(u.shape[0])
            seen.append(u)
        curve = distinct_curve(seen)
        distinct = int(curve[-1]) if seen else 0
        rows = t.num_embeddings or predicted_rows(curve, steps, t.hash_size)
        width = t.dim + SparseOptimizer(t.optimizer).state_width(t.dim)
        out[t.name] = TableStats(rows=int(rows), row_bytes=4 * width, dim=t.dim,
                                 features=len(t.features), ids_per_sample=ids_total / samples,
                                 unique_per_batch=float(np.mean(uniques)) if uniques else 0.0,
                                 pooled=t.pooling != "none", distinct=distinct,
                                 hotness=hotness(t, seen) if hotness is not None else ())
    return out
