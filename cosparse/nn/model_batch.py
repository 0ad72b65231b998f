"""``Batch``: what the forward of a user's model receives, a thin view over the engine's
prepared batch (whose cache plan stays inside: only the ``EmbeddingBagCollection`` reads it).

``dense`` and ``labels`` are on the trainer's device, moved on first use; ``sparse`` is the
batch's IDs in TorchRec's ``KeyedJaggedTensor`` shape (``keys``, ``values``, ``lengths``,
``offsets``, ``to_dict``), on the host, where the engine does its ID work.
"""

from __future__ import annotations

from typing import Any

import torch

from cosparse.batch import SparseBatch
from cosparse.nn.types import Jagged, PreparedBatch


class KeyedIds:
    """The IDs of every feature, feature-major, as in a ``KeyedJaggedTensor``."""

    def __init__(self, batch: SparseBatch) -> None:
        self._batch = batch

    def keys(self) -> list[str]:
        return list(self._batch.keys)

    def values(self) -> torch.Tensor:
        """int64 [total IDs]: feature 0's bags, then feature 1's, ..."""
        return self._batch.values

    def lengths(self) -> torch.Tensor:
        """int64 [len(keys) * B]: the bag length of each (feature, sample)."""
        return self._batch.lengths

    def offsets(self) -> torch.Tensor:
        """int64 [len(keys) * B + 1]: exclusive prefix sums of ``lengths``."""
        return self._batch.offsets

    def stride(self) -> int:
        """The batch size B."""
        return self._batch.batch_size

    def to_dict(self) -> dict[str, Jagged]:
        """Per feature: its IDs as a ``Jagged`` value (``values`` [n] int64, ``lengths`` [B],
        ``offsets`` [B + 1])."""
        out = {}
        for key in self._batch.keys:
            ids, lengths = self._batch.feature(key)
            offsets = torch.zeros(lengths.shape[0] + 1, dtype=torch.int64)
            torch.cumsum(lengths, 0, out=offsets[1:])
            out[key] = Jagged(ids, lengths, offsets)
        return out

    def __repr__(self) -> str:
        return f"KeyedIds(keys={self.keys()}, ids={self._batch.values.shape[0]})"


class Batch:
    """One batch as the model sees it: ``dense`` [B, n] float32, ``sparse`` (``KeyedIds``),
    ``labels`` (``dict[task, Tensor[B]]``: each task's, or the one task ``label``), ``weights``
    (``data.columns.weight``'s, or None: every sample weighs 1)."""

    def __init__(self, prepared: PreparedBatch, device: torch.device) -> None:
        self._prepared = prepared
        self.device = device
        self.sparse = KeyedIds(prepared.batch)
        w = prepared.batch.weights
        self.weights: torch.Tensor | None = (None if w is None
                                             else w.to(device, non_blocking=True))
        self._dense: torch.Tensor | None = None
        self._labels: dict[str, torch.Tensor] | None = None
        self._looked_up: tuple[Any, Any] | None = None  # (engine, its lookup of this batch)

    @property
    def batch_size(self) -> int:
        return self._prepared.batch.batch_size

    @property
    def dense(self) -> torch.Tensor:
        if self._dense is None:
            self._dense = self._prepared.batch.dense.to(self.device, non_blocking=True)
        return self._dense

    @property
    def dense_keys(self) -> list[str] | None:
        """The names of the ``dense`` columns, where the source names them."""
        return self._prepared.batch.dense_keys

    @property
    def labels(self) -> dict[str, torch.Tensor]:
        if self._labels is None:
            raw = self._prepared.batch
            tasks = raw.task_labels if raw.task_labels is not None else {"label": raw.labels}
            self._labels = {k: v.to(self.device, non_blocking=True) for k, v in tasks.items()}
        return self._labels

    def looked_up(self, engine: Any) -> Any:
        """``engine``'s lookup of this batch, every table's, done once however many of the
        model's collections ask (each takes its own features from it)."""
        if self._looked_up is None or self._looked_up[0] is not engine:
            self._looked_up = (engine, engine(self._prepared))
        return self._looked_up[1]

    def __repr__(self) -> str:
        return (f"Batch(batch_size={self.batch_size}, dense={tuple(self._prepared.batch.dense.shape)}"
                f", sparse={self.sparse.keys()})")
