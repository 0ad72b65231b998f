"""Admission: an ID gets its own row only after it has been seen ``min_count`` times.

Until then it reads a shared default (zero) row and trains nothing. Sightings are counted in a
count-min sketch, so memory stays bounded however many distinct IDs pass by (the sketch may
over-count, admitting an ID slightly early, never late). Not exact by design: off by default.
"""

from __future__ import annotations

import numpy as np

from cosparse.store import kernels


class Admission:
    def __init__(self, min_count: int, width: int = 1 << 18, depth: int = 4) -> None:
        self.min_count = min_count
        self.sketch = np.zeros((depth, width), dtype=np.uint32)
        self.rejected = 0  # lookups served by the default row

    def observe(self, unique: np.ndarray) -> np.ndarray:
        """Count one sighting of each unique ID; True where the ID has (or now gets) a row."""
        admitted = np.empty(unique.shape[0], dtype=np.bool_)
        n = kernels.cms_observe(self.sketch, unique, self.min_count, admitted)
        self.rejected += unique.shape[0] - int(n)
        return admitted
