"""Architecture B for several models on one extraction: the shared stream's batch codec.

In a data worker, ``encode`` builds the union batch once (each feature of every model computed
once), then hands each model's view of it to that model's own collaborative codec: the model's
dedup, its resident filter, its cold-row pulls over its own PS connection and namespace, into its
own shared-memory file. A pull that fails is that model's alone: its part goes without the rows
and names the error, so that model falls back and the others go on. The union's plain arrays
travel too only when some model has no live supply (it fell back in an earlier epoch).

``decode``, in the trainer process, gives the union batch with ``parts``: each model's own
batch, as its codec decoded it. The fan-out (``cosparse.train.fanout``) hands each model its
part, or its view of the plain union when it has none.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from cosparse.batch import SparseBatch
from cosparse.supply.collaborative.worker import BatchBuilder


class PartCodec(Protocol):
    """One model's codec: a batch already built (in the worker) to a message, and back."""

    def encode_built(self, batch: SparseBatch, t0: float, t_built: float,
                     keep_going: bool = False) -> Any: ...
    def decode(self, msg: Any) -> SparseBatch: ...
    def close(self) -> None: ...


Select = Callable[[SparseBatch], SparseBatch]  # a model's view of a union batch (picklable)


class ModelsCodec:
    """The union batch built once, each model's part encoded by its own codec."""

    def __init__(self, reader: BatchBuilder, parts: Mapping[str, tuple[Select, PartCodec]],
                 plain: bool) -> None:
        if not parts and not plain:
            raise ValueError("a shared stream's codec needs a model's part or the plain union")
        self.reader = reader
        self.parts = dict(parts)
        self.plain = plain  # a model without a live supply reads the union's plain arrays

    # --- in the data worker -------------------------------------------------------------------
    def encode(self, task: Any) -> dict[str, Any]:
        t0 = time.perf_counter()
        batch = self.reader.build(task)
        t_built = time.perf_counter()
        parts = {name: codec.encode_built(select(batch), t0, t_built, keep_going=True)
                 for name, (select, codec) in self.parts.items()}
        plain = None
        if self.plain:
            batch.build_ms = (t_built - t0) * 1e3
            batch.worker_spans = [os.getpid(), [["build (read, featurize)", t0, t_built]]]
            plain = batch.to_arrays()
        return {"parts": parts, "plain": plain}

    def close(self) -> None:
        for _, codec in self.parts.values():
            codec.close()

    # --- in the trainer -----------------------------------------------------------------------
    def decode(self, msg: dict[str, Any]) -> SparseBatch:
        parts = {name: self.parts[name][1].decode(m) for name, m in msg["parts"].items()}
        wire = sum(p.wire_bytes for p in parts.values())
        if msg["plain"] is not None:
            union = SparseBatch.from_arrays(msg["plain"])
            wire += sum(v.nbytes for v in msg["plain"].values() if hasattr(v, "nbytes"))
        else:  # every model reads its own part: the union's counters are in each of them
            union = dataclasses.replace(next(iter(parts.values())), delivery=None,
                                        prepared_ids=None)
        union.parts = parts
        union.wire_bytes = wire
        return union
