"""SparseBatch: jagged int64 IDs per feature, dense floats and labels, in TorchRec's KJT layout.

The IDs of all features are concatenated feature-major (all of feature 0's bags, then feature 1's),
exactly like TorchRec's ``KeyedJaggedTensor``: ``values`` holds the IDs and ``lengths`` has one entry
per (feature, sample). Conversion to and from that layout needs no torchrec import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass
class SparseBatch:
    """One batch of samples.

    keys:    feature names, in the order their IDs appear in ``values``.
    values:  int64 [total_ids], feature-major jagged IDs.
    lengths: int64 [len(keys) * batch_size], bag length per (feature, sample).
    dense:   float32 [batch_size, num_dense].
    labels:  float32 [batch_size].
    bad_records: records of the source chunk that were skipped (``on_bad_record: skip``).
    index:   position of this batch in its stream (used for resume and ordering checks).
    delivery, wire_bytes: see the field comments (set by the batch stream).
    dense_keys: names of the ``dense`` columns, when the source names them (the feature platform).
    features_computed: feature computations the extractor ran to build this batch (0: no platform).
    build_ms: time the reader took to build this batch (parse and featurize), wherever it ran.
    worker_spans: ``[pid, [[name, t0, t1], ...]]``: what the data worker that built this batch
             did for it, when (perf_counter seconds; the step records' trace), or None.
    prepared_ids: per table, the ID work a data worker already did (``TableIds``), or None; such
             a batch's ID columns hold each table's row keys (its IDs after ``hash_size``).
    parts:   a shared stream's batch (several models under architecture B): each model's own
             batch, built by the data worker with that model's dedup and cold rows, by name.
    """

    keys: list[str]
    values: torch.Tensor
    lengths: torch.Tensor
    dense: torch.Tensor
    labels: torch.Tensor
    bad_records: int = 0
    index: int = 0
    _offsets: torch.Tensor | None = field(default=None, repr=False, compare=False)
    # what travelled with the batch from a data worker: rows it delivered (architecture B) and
    # the bytes of the whole message on the worker->trainer link
    delivery: Any = field(default=None, repr=False, compare=False)
    wire_bytes: int = field(default=0, repr=False, compare=False)
    dense_keys: list[str] | None = field(default=None, compare=False)
    features_computed: int = field(default=0, compare=False)
    build_ms: float = field(default=0.0, compare=False)
    worker_spans: list | None = field(default=None, repr=False, compare=False)
    prepared_ids: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    parts: dict[str, SparseBatch] | None = field(default=None, repr=False, compare=False)
    # several tasks' labels (float32 [batch_size] each; None: the one task, ``labels``) and
    # per-sample weights (float32 [batch_size]; None: each sample weighs 1)
    task_labels: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    weights: torch.Tensor | None = field(default=None, repr=False)
    # how many items the uniform negatives (features neg{j}_*) were drawn from (0: none)
    negative_pool: int = 0

    def __post_init__(self) -> None:
        if self.values.dtype != torch.int64:
            raise TypeError(f"SparseBatch.values must be int64, got {self.values.dtype}")
        b = self.batch_size
        if self.lengths.numel() != len(self.keys) * b:
            raise ValueError(
                f"SparseBatch.lengths has {self.lengths.numel()} entries, expected "
                f"{len(self.keys)} features x {b} samples"
            )
        if self.dense.shape[0] != b:
            raise ValueError(f"SparseBatch.dense has {self.dense.shape[0]} rows, labels have {b}")
        if self.dense_keys is not None and len(self.dense_keys) != self.dense.shape[1]:
            raise ValueError(f"SparseBatch.dense_keys names {len(self.dense_keys)} columns, dense "
                             f"has {self.dense.shape[1]}")

    @property
    def batch_size(self) -> int:
        return int(self.labels.shape[0])

    @property
    def offsets(self) -> torch.Tensor:
        """int64 [len(keys) * batch_size + 1] exclusive prefix sums of ``lengths``."""
        if self._offsets is None:
            off = torch.zeros(self.lengths.numel() + 1, dtype=torch.int64)
            torch.cumsum(self.lengths, 0, out=off[1:])
            self._offsets = off
        return self._offsets

    def feature(self, key: str) -> tuple[torch.Tensor, torch.Tensor]:
        """IDs and lengths [batch_size] of one feature (views, no copy)."""
        f = self.keys.index(key)
        b = self.batch_size
        off = self.offsets
        lo, hi = int(off[f * b]), int(off[(f + 1) * b])
        return self.values[lo:hi], self.lengths[f * b : (f + 1) * b]

    def to(self, device: torch.device | str) -> SparseBatch:
        return SparseBatch(
            self.keys,
            self.values.to(device),
            self.lengths.to(device),
            self.dense.to(device),
            self.labels.to(device),
            self.bad_records,
            self.index,
            dense_keys=self.dense_keys,
            features_computed=self.features_computed,
            build_ms=self.build_ms,
            worker_spans=self.worker_spans,
            task_labels=None if self.task_labels is None else {
                k: v.to(device) for k, v in self.task_labels.items()},
            weights=None if self.weights is None else self.weights.to(device),
            negative_pool=self.negative_pool,
        )

    # --- TorchRec KeyedJaggedTensor layout -------------------------------------------------
    def to_kjt_layout(self) -> dict[str, object]:
        """The (keys, values, lengths) triple that ``KeyedJaggedTensor(**layout)`` accepts."""
        return {"keys": list(self.keys), "values": self.values, "lengths": self.lengths}

    @classmethod
    def from_kjt_layout(
        cls,
        keys: list[str],
        values: torch.Tensor,
        lengths: torch.Tensor,
        dense: torch.Tensor,
        labels: torch.Tensor,
    ) -> SparseBatch:
        return cls(list(keys), values.long(), lengths.long(), dense.float(), labels.float())

    # --- plain arrays, for transport between processes (no pickled tensors) -----------------
    def to_arrays(self) -> dict[str, object]:
        return {
            "keys": list(self.keys),
            "values": self.values.numpy(),
            "lengths": self.lengths.numpy(),
            "dense": self.dense.numpy(),
            "labels": self.labels.numpy(),
            "bad_records": self.bad_records,
            "index": self.index,
            "dense_keys": None if self.dense_keys is None else list(self.dense_keys),
            "features_computed": self.features_computed,
            "build_ms": self.build_ms,
            "worker_spans": self.worker_spans,
            "task_labels": None if self.task_labels is None else {
                k: v.numpy() for k, v in self.task_labels.items()},
            "weights": None if self.weights is None else self.weights.numpy(),
            "negative_pool": self.negative_pool,
        }

    @classmethod
    def from_arrays(cls, a: dict[str, object]) -> SparseBatch:
        return cls(
            list(a["keys"]),  # type: ignore[arg-type]
            torch.from_numpy(np.ascontiguousarray(a["values"], dtype=np.int64)),
            torch.from_numpy(np.ascontiguousarray(a["lengths"], dtype=np.int64)),
            torch.from_numpy(np.ascontiguousarray(a["dense"], dtype=np.float32)),
            torch.from_numpy(np.ascontiguousarray(a["labels"], dtype=np.float32)),
            int(a["bad_records"]),  # type: ignore[arg-type]
            int(a["index"]),  # type: ignore[arg-type]
            dense_keys=a.get("dense_keys"),  # type: ignore[arg-type]
            features_computed=int(a.get("features_computed", 0)),  # type: ignore[arg-type]
            build_ms=float(a.get("build_ms", 0.0)),  # type: ignore[arg-type]
            worker_spans=a.get("worker_spans"),  # type: ignore[arg-type]
            task_labels=None if a.get("task_labels") is None else {
                k: _floats(v) for k, v in a["task_labels"].items()},  # type: ignore[union-attr]
            weights=None if a.get("weights") is None else _floats(a["weights"]),
            negative_pool=int(a.get("negative_pool", 0)),  # type: ignore[arg-type]
        )


def _floats(a: Any) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))


def concat_batches(batches: list[SparseBatch]) -> SparseBatch:
    """One batch holding the samples of ``batches`` in order (same keys), feature-major like each
    of them: feature f's bags of every batch, then feature f+1's. Copies per feature, not per ID."""
    if len(batches) == 1:
        return batches[0]
    keys = batches[0].keys
    values, lengths = [], []
    for f in range(len(keys)):
        for b in batches:
            n, off = b.batch_size, b.offsets
            values.append(b.values[int(off[f * n]) : int(off[(f + 1) * n])])
            lengths.append(b.lengths[f * n : (f + 1) * n])
    return SparseBatch(
        list(keys), torch.cat(values), torch.cat(lengths),
        torch.cat([b.dense for b in batches]), torch.cat([b.labels for b in batches]),
        sum(b.bad_records for b in batches), batches[0].index, dense_keys=batches[0].dense_keys,
        features_computed=sum(b.features_computed for b in batches),
        build_ms=sum(b.build_ms for b in batches),
        task_labels=None if batches[0].task_labels is None else {
            k: torch.cat([b.task_labels[k] for b in batches])  # type: ignore[index]
            for k in batches[0].task_labels},
        weights=None if batches[0].weights is None else torch.cat(
            [b.weights for b in batches]),  # type: ignore[misc]
        negative_pool=batches[0].negative_pool,
    )
