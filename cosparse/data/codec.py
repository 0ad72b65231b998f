"""How a batch crosses from a data worker to the consumer: the ``BatchCodec`` protocol (``encode``
in the worker, ``decode`` in the consumer) and ``PlainCodec``, plain numpy arrays through the
worker's queue."""

from __future__ import annotations

import os
import time
from typing import Any, Protocol

from cosparse.batch import SparseBatch
from cosparse.data.reader import Reader


class PlainCodec:
    """Batches travel as plain numpy arrays through the worker's queue."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader

    def encode(self, task: Any) -> dict[str, Any]:  # in the worker
        t0 = time.perf_counter()
        batch = self.reader.build(task)
        t1 = time.perf_counter()
        batch.build_ms = (t1 - t0) * 1e3  # the featurize stage
        batch.worker_spans = [os.getpid(), [["build (read, featurize)", t0, t1]]]
        return batch.to_arrays()

    def decode(self, payload: dict[str, Any]) -> SparseBatch:  # in the consumer
        batch = SparseBatch.from_arrays(payload)
        batch.wire_bytes = sum(v.nbytes for v in payload.values() if hasattr(v, "nbytes"))
        return batch

    def close(self) -> None:
        pass


class BatchCodec(Protocol):
    """How a task becomes a message in a worker (``encode``) and a batch in the consumer."""

    def encode(self, task: Any) -> Any: ...
    def decode(self, msg: Any) -> SparseBatch: ...
    def close(self) -> None: ...
