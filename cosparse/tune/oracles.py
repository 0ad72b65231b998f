"""The offline bounds: Belady's MIN (``belady_hit_rate``) and the static popularity oracle.

Both run in the shared simulator (``cosparse.tune.kernels.simulate_cache``) with a priority that
needs the whole trace: Belady evicts the row whose next use is farthest (next uses come from one
backward pass, ``kernels.next_use``, and the resident rows sit in a lazy heap, O(lookups log C));
the popularity oracle ranks rows by their total count over the trace. The exact semantics, and
how prefetched rows count under ``lookahead > 0``, are in ``cosparse.tune.cache_sim``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cosparse.tune.cache_sim import simulate
from cosparse.tune.types import Trace


def belady_hit_rate(trace: Trace | Sequence[np.ndarray], num_ids: int, capacity: int,
                    lookahead: int = 0) -> float:
    """Belady's MIN hit rate of a ``capacity``-row cache (NaN when infeasible).

    ``lookahead=0``: demand fetching, the upper bound of every demand-fetching policy.
    ``lookahead=k``: ``belady_prefetch_k``, with the window, pinning and prefetch rules of
    ``lookahead-k`` (prefetched rows count as hits), so the two compare like for like.
    """
    return simulate(trace, num_ids, capacity, "belady", lookahead).hit_rate


def popularity_oracle_hit_rate(trace: Trace | Sequence[np.ndarray], num_ids: int, capacity: int,
                               lookahead: int = 0) -> float:
    """Hit rate of the static popularity oracle (NaN when infeasible): each batch's rows (the
    window's with ``lookahead``) plus, in the other slots, the rows with the highest total count
    over the whole trace among those already fetched."""
    return simulate(trace, num_ids, capacity, "popularity_oracle", lookahead).hit_rate
