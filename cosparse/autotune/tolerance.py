"""Whether a reordering trial (several ranks, another sharding) trained the start's numbers
within the tolerance the parallelism work states: losses within 1e-6, rows (values and
optimizer state) within 1e-4 of their largest magnitude.

The rows' bound is the parallelism tests' (``tests/test_parallel.py``): Adagrad and Adam divide
a row's update by its own accumulated gradient, so a last-bit change in a near-cancelling
gradient sum, which any reordering of the sum may make, moves that row by more than 1e-6.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

LOSS_TOL = 1e-6
ROW_TOL = 1e-4


def outside_tolerance(start: Path, trial: Path) -> str | None:
    """None when ``trial``'s numbers (a ``trial_run --numbers`` file) are within tolerance of
    ``start``'s; else what differs, by how much."""
    with np.load(start) as a, np.load(trial) as b:
        la, lb = a["losses"], b["losses"]
        if la.shape != lb.shape:
            return f"{lb.shape[0]} losses against the start's {la.shape[0]}"
        loss = float(np.max(np.abs(la - lb))) if la.size else 0.0
        if loss > LOSS_TOL:
            return f"losses differ by up to {loss:.2e} (tolerance {LOSS_TOL:g})"
        tables = sorted(k[len("ids/"):] for k in a.files if k.startswith("ids/"))
        for name in tables:
            if f"ids/{name}" not in b.files or not np.array_equal(a[f"ids/{name}"],
                                                                  b[f"ids/{name}"]):
                return f"table '{name}' holds other rows than the start's"
            ra, rb = a[f"rows/{name}"], b[f"rows/{name}"]
            scale = max(float(np.max(np.abs(ra))) if ra.size else 0.0, 1e-30)
            rel = float(np.max(np.abs(ra - rb))) / scale if ra.size else 0.0
            if rel > ROW_TOL:
                return f"table '{name}': rows differ by up to {rel:.2e} of their largest " \
                       f"(tolerance {ROW_TOL:g})"
    return None
