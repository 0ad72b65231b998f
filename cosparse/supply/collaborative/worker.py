"""The data-worker side of the collaborative supply.

``CollaborativeCodec.encode`` runs in each data worker process: it builds the batch, does each
table's ID work (unique IDs, inverse and transposed index: the trainer uses it as it is), asks
the published resident filter which of the unique IDs the trainer may hold, pulls the others
(rows with their optimizer state, and the shard write counters) over the worker's own PS
connection, and packs samples, ID work and rows into one shared-memory file.
``decode`` runs in the trainer and maps that file back. With ``workers: 0`` both run in the
trainer process, still over a connection of their own.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from cosparse.batch import SparseBatch
from cosparse.link import LinkSpec
from cosparse.ps.client import PSClient, PSError
from cosparse.store.dedup import Deduper, TableIds, table_ids
from cosparse.supply.collaborative.resident_filter import FilterLayout, FilterView
from cosparse.supply.collaborative.shared_batch import read_arrays, write_arrays
from cosparse.supply.collaborative.types import DeliveredRows, Delivery

_SAMPLE_ARRAYS = ("values", "lengths", "dense", "labels")
_ID_ARRAYS = ("unique", "inverse", "offsets", "t_offsets", "t_bags", "t_weights")  # TableIds


class BatchBuilder(Protocol):
    """What the codec needs of a data reader: a batch from one of its tasks (picklable, as it
    travels to the worker processes)."""

    def build(self, task: Any) -> SparseBatch: ...


class DeliveryError(RuntimeError):
    """A data worker could not bring its rows (PS unreachable, refused, timed out)."""


@dataclass(frozen=True)
class TableKeys:
    """What a worker needs to know of a table to find its IDs in a batch."""

    name: str
    features: tuple[str, ...]
    hash_size: int | None
    pooling: str = "sum"


@dataclass(frozen=True)
class WorkerPS:
    """How a worker reaches the PS (its own connection and, when simulated, its own link)."""

    endpoints: tuple[str, ...]
    timeout_s: float = 30.0
    heartbeat_s: float = 1.0
    auth_key: str | None = None
    link: LinkSpec | None = None


class CollaborativeCodec:
    """Builds batches with their cold rows (``encode``, in a worker) and unpacks them (``decode``)."""

    def __init__(self, reader: BatchBuilder, tables: list[TableKeys], ps: WorkerPS, layout: FilterLayout,
                 shm_dir: str) -> None:
        self.reader = reader
        self.tables = tables
        self.ps = ps
        self.layout = layout
        self.shm_dir = shm_dir
        self._client: PSClient | None = None
        self._view: FilterView | None = None
        self._reported = 0
        self._names = itertools.count()
        self._dedupers: dict[str, Deduper] | None = None  # the worker's own scratch

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = state["_view"] = None
        state["_reported"] = 0
        state["_names"] = None
        state["_dedupers"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._names = itertools.count()

    # --- in the data worker -------------------------------------------------------------------
    def _connect(self) -> tuple[PSClient, FilterView]:
        if self._client is None:
            p = self.ps
            self._client = PSClient(list(p.endpoints), p.timeout_s, p.heartbeat_s, auth_key=p.auth_key,
                                    link=p.link.shaper() if p.link is not None else None)
        if self._view is None:
            self._view = FilterView(self.layout)
        return self._client, self._view

    def encode(self, task: Any) -> tuple[Any, ...]:
        t0 = time.perf_counter()
        batch = self.reader.build(task)
        build_ms = (time.perf_counter() - t0) * 1e3
        client, view = self._connect()
        arrays: dict[str, np.ndarray] = {k: v for k, v in batch.to_arrays().items()
                                         if k in _SAMPLE_ARRAYS}
        if self._dedupers is None:
            self._dedupers = {t.name: Deduper() for t in self.tables}
        for t in self.tables:
            tids = table_ids(batch, t.features, t.hash_size, t.pooling, self._dedupers[t.name])
            for part in _ID_ARRAYS:
                arrays[f"i.{t.name}.{part}"] = getattr(tids, part)
            answer = view.resident(t.name, tids.unique)
            if answer is None:
                continue  # no consistent filter yet: the trainer fetches this table itself
            maybe_resident, _ = answer
            cold = np.sort(tids.unique[~maybe_resident])  # delivered IDs are sorted
            if not cold.shape[0]:
                continue
            try:
                pulled = client.pull(t.name, cold, with_state=True, peek=True)
            except PSError as e:
                raise DeliveryError(f"data worker pid {os.getpid()}: pulling {cold.shape[0]} rows of "
                                    f"table '{t.name}' failed: {e}") from None
            counters = np.full(client.num_shards, -1, dtype=np.int64)
            for shard, c in pulled.write_counters.items():
                counters[shard] = c
            arrays[f"d.{t.name}.ids"] = cold
            arrays[f"d.{t.name}.rows"] = pulled.rows
            arrays[f"d.{t.name}.counters"] = counters
        path = str(Path(self.shm_dir) / f"{os.getpid()}-{next(self._names)}.batch")
        layout, payload = write_arrays(path, arrays)
        c = client.counters
        moved = c.bytes_pull + c.bytes_push + c.bytes_other
        meta = {"keys": list(batch.keys), "bad_records": batch.bad_records, "index": batch.index,
                "dense_keys": batch.dense_keys, "features_computed": batch.features_computed,
                "pid": os.getpid(), "worker_ps_bytes": moved - self._reported,
                "payload": payload, "build_ms": build_ms}
        self._reported = moved
        return ("shm", path, layout, meta)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # --- in the trainer -----------------------------------------------------------------------
    def decode(self, msg: tuple[Any, ...]) -> SparseBatch:
        _, path, layout, meta = msg
        arrays = read_arrays(path, layout)
        batch = SparseBatch.from_arrays({**{k: arrays[k] for k in _SAMPLE_ARRAYS},
                                         "keys": meta["keys"], "bad_records": meta["bad_records"],
                                         "index": meta["index"],
                                         "dense_keys": meta.get("dense_keys"),
                                         "features_computed": meta.get("features_computed", 0),
                                         "build_ms": meta["build_ms"]})
        delivery = Delivery(worker_ps_bytes=meta["worker_ps_bytes"], worker_pid=meta["pid"])
        batch.prepared_ids = {}
        for t in self.tables:
            batch.prepared_ids[t.name] = TableIds(*(arrays[f"i.{t.name}.{p}"] for p in _ID_ARRAYS))
            if f"d.{t.name}.ids" in arrays:
                delivery.rows[t.name] = DeliveredRows(*(arrays[f"d.{t.name}.{part}"] for part in
                                                        ("ids", "rows", "counters")))
        batch.delivery = delivery
        batch.wire_bytes = int(meta["payload"])
        return batch
