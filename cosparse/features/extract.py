"""Extract once, fan out: a FeatureExtractor computes the closure of its outputs over a RawBatch in
topological order, each feature exactly once per batch (``compute``), and its FeatureBatch builds
each consumer's SparseBatch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from cosparse.batch import SparseBatch
from cosparse.data.errors import DataError
from cosparse.features.compute import compute_plan, prepare_states
from cosparse.features.feature_set import FeatureSet
from cosparse.features.types import DENSE, RawBatch
from cosparse.features.types import Column as Column


@dataclass
class FeatureBatch:
    """The extracted features of one RawBatch: name -> Column, plus labels and bookkeeping.

    ``computed`` is the number of feature computations this batch took.
    """

    columns: dict[str, Column]
    kinds: dict[str, str]
    labels: np.ndarray
    index: int = 0
    bad_records: int = 0
    computed: int = 0
    source: str = field(default="", compare=False)

    @property
    def num_rows(self) -> int:
        return int(self.labels.shape[0])

    def ids(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(int64 IDs, int64 lengths [N]) of a sparse or sequence feature (a scalar gives 0/1 bags)."""
        c = self._get(name)
        if c.lengths is not None:
            return c.values, c.lengths
        if c.present is None:
            return c.values, np.ones(len(c.values), np.int64)
        return c.values[c.present], c.present.astype(np.int64)

    def dense_values(self, name: str) -> np.ndarray:
        """float32 [N] values of a dense feature (a missing value is a DataError)."""
        c = self._get(name)
        if c.present is not None and not c.present.all():
            rows = np.flatnonzero(~c.present)
            raise DataError(f"{self.source}batch {self.index}: dense feature '{name}' has "
                            f"{len(rows)} missing values (first at row {int(rows[0])} of the batch); "
                            f"add a fill_missing transform")
        return c.values.astype(np.float32)

    def _get(self, name: str) -> Column:
        if name not in self.columns:
            raise KeyError(f"feature '{name}' was not extracted (outputs: {', '.join(self.columns)})")
        return self.columns[name]

    def to_sparse_batch(self, sparse: Sequence[str], dense: Sequence[str]) -> SparseBatch:
        """A SparseBatch with ``sparse`` (sparse and sequence features) as jagged keys in order,
        ``dense`` stacked as float32 [N, len(dense)] columns named by ``dense_keys``."""
        for n in sparse:
            if self.kinds.get(n) == DENSE:
                raise ValueError(f"feature '{n}' is dense; list it under dense, not sparse")
        for n in dense:
            if n in self.kinds and self.kinds[n] != DENSE:
                raise ValueError(f"feature '{n}' is {self.kinds[n]}; list it under sparse, not dense")
        n_rows = self.num_rows
        vals, lens = [], []
        for n in sparse:
            v, ln = self.ids(n)
            vals.append(v)
            lens.append(ln)
        values = np.concatenate(vals) if vals else np.zeros(0, np.int64)
        lengths = np.concatenate(lens) if lens else np.zeros(0, np.int64)
        dense_arr = np.empty((n_rows, len(dense)), np.float32)
        for j, n in enumerate(dense):
            dense_arr[:, j] = self.dense_values(n)
        return SparseBatch(
            list(sparse),
            torch.from_numpy(np.ascontiguousarray(values, np.int64)),
            torch.from_numpy(np.ascontiguousarray(lengths, np.int64)),
            torch.from_numpy(dense_arr),
            torch.from_numpy(np.ascontiguousarray(self.labels, np.float32)),
            bad_records=self.bad_records,
            index=self.index,
            dense_keys=list(dense),
            features_computed=self.computed,
        )


class FeatureExtractor:
    """Computes ``outputs`` (and what they depend on) from RawBatches, each feature once per batch.

    ``computed`` and ``batches`` count feature computations and batches over the extractor's life.
    """

    def __init__(self, feature_set: FeatureSet, outputs: Sequence[str]) -> None:
        self.feature_set = feature_set
        self.outputs = list(dict.fromkeys(outputs))
        self.plan: list[str] = feature_set.closure(self.outputs)
        feature_set.check_fitted(self.outputs)
        self.raw_columns: list[str] = feature_set.raw_inputs(self.outputs)
        self.computed = 0
        self.batches = 0
        self._states: dict[str, list[Any]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["_states"] = None  # rebuilt in the worker process
        return d

    def _ensure_states(self) -> dict[str, list[Any]]:
        if self._states is None:
            self._states = {n: prepare_states(self.feature_set.features[n]) for n in self.plan}
        return self._states

    def extract(self, raw: RawBatch) -> FeatureBatch:
        """The outputs of one RawBatch (``FeatureBatch.computed`` == len(self.plan))."""
        states = self._ensure_states()
        fs = self.feature_set
        done = compute_plan(fs.features, self.plan, self.raw_columns, states, raw)
        self.computed += len(self.plan)
        self.batches += 1
        cols = {n: done[n] for n in self.outputs}
        kinds = {n: fs.features[n].kind for n in self.outputs}
        return FeatureBatch(cols, kinds, raw.labels, raw.index, raw.bad_records, len(self.plan),
                            raw.source)
