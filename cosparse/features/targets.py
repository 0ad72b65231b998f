"""The targets of several tasks from a raw batch's columns (``data.columns.labels`` and
``data.columns.weight``): a binary task's label mapped to 0/1 by ``cosparse.features.label_map``,
a regression task's label and the weight any finite number. Rows with a missing or bad target
are bad records (``data.on_bad_record``)."""

from __future__ import annotations

import numpy as np

from cosparse.config.labels import LabelConfig
from cosparse.data.errors import DataError
from cosparse.features import label_map
from cosparse.features.types import FLOAT, INT, Column, RawBatch


def _numbers(col: Column, what: str) -> tuple[np.ndarray, np.ndarray]:
    if col.kind not in (INT, FLOAT):
        raise DataError(f"column {what} holds {col.kind} values, not numbers")
    v = col.values.astype(np.float32)
    bad = ~col.present_mask() | ~np.isfinite(v)
    return np.where(bad, np.float32(0), v), bad


class Targets:
    """Reads the tasks' labels (``labels``: task -> rule; ``regression``: those tasks that are
    regressions) and the weight column (None: no weights) of raw batches."""

    def __init__(self, labels: dict[str, LabelConfig], regression: set[str],
                 weight: str | None, on_bad_record: str) -> None:
        self.labels, self.regression, self.weight = labels, regression, weight
        self.on_bad_record = on_bad_record

    @property
    def columns(self) -> list[str]:
        return [r.column for r in self.labels.values()] + ([self.weight] if self.weight else [])

    def values(self, raw: RawBatch
               ) -> tuple[dict[str, np.ndarray], np.ndarray | None, np.ndarray]:
        """(each task's labels float32, the weights or None, the rows whose targets are bad) of
        every row of ``raw``; with ``on_bad_record: fail`` a bad row is a DataError."""
        out: dict[str, np.ndarray] = {}
        bad_any = np.zeros(raw.num_rows, np.bool_)
        firsts: list[tuple[str, np.ndarray]] = []
        for task, rule in self.labels.items():
            col = raw.columns[rule.column]
            what = f"{rule.column} (label of task {task})"
            if task in self.regression:
                out[task], bad = _numbers(col, what)
            else:
                try:
                    out[task], bad = label_map.column_labels(col, rule)
                except DataError as e:
                    raise DataError(f"{raw.source}data.columns.labels.{task}: {e}") from None
            firsts.append((what, bad))
            bad_any |= bad
        weights = None
        if self.weight is not None:
            weights, bad = _numbers(raw.columns[self.weight], f"{self.weight} (the weight)")
            firsts.append((f"{self.weight} (the weight)", bad))
            bad_any |= bad
        if self.on_bad_record == "fail" and bad_any.any():
            r = int(np.flatnonzero(bad_any)[0])
            what = next(w for w, b in firsts if b[r])
            raise DataError(f"{raw.source}row {r + 1} of batch {raw.index}: column {what} is "
                            "missing or not a finite number"
                            + ("" if "weight" in what else " (a binary label: 0/1 unless "
                               "data.columns.labels maps it)")
                            + "; data.on_bad_record: skip skips such rows")
        return out, weights, bad_any

    def read(self, raw: RawBatch
             ) -> tuple[RawBatch, dict[str, np.ndarray], np.ndarray | None]:
        """(``raw`` less its bad rows, each task's labels float32, the weights or None)."""
        out, weights, bad_any = self.values(raw)
        n_bad = int(bad_any.sum())
        if not n_bad:
            return raw, out, weights
        keep = ~bad_any
        raw = RawBatch({c: v.filter(keep) for c, v in raw.columns.items()}, raw.labels[keep],
                       raw.index, raw.bad_records + n_bad, raw.source)
        return raw, {t: v[keep] for t, v in out.items()}, (None if weights is None
                                                           else weights[keep])
