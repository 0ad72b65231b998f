"""The data-worker side of the collaborative supply.

``CollaborativeCodec.encode`` runs in each data worker process: it builds the batch, dedups each
table's IDs (the trainer uses these unique IDs and inverse index as they are: the dedup is done
once), asks the published resident filter which of the unique IDs the trainer may hold, pulls
the others (rows with their optimizer state, and the shard write counters) over the worker's
own PS connection, and packs samples and rows into one shared-memory file. A table's IDs travel
as its unique IDs and an int32 inverse index instead of the raw ID columns (fewer bytes on the
worker->trainer link); ``decode`` rebuilds the columns from them, as the table's row keys.
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
from cosparse.ps.errors import PSUnavailable
from cosparse.store.dedup import (
    Deduper,
    TableIds,
    bag_offsets,
    map_ids,
    row_owner,
    table_parts,
    with_bags,
)
from cosparse.supply.collaborative.resident_filter import FilterLayout, FilterView
from cosparse.supply.collaborative.shared_batch import read_arrays, write_arrays
from cosparse.supply.collaborative.types import DeliveredRows, Delivery

_SAMPLE_ARRAYS = ("lengths", "dense", "labels")  # the ID columns travel as each table's dedup


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
    rows_of: tuple[int, int] | None = None  # a row-wise shard's: (shard, shards)
    remote_name: str = ""  # its name on the PS (a column shard's own table there); "": name


@dataclass(frozen=True)
class WorkerPS:
    """How a worker reaches the PS (its own connection and, when simulated, its own link)."""

    endpoints: tuple[str, ...]
    timeout_s: float = 30.0
    heartbeat_s: float = 1.0
    auth_key: str | None = None
    link: LinkSpec | None = None
    namespace: str = "default"  # the PS namespace of its tables (store.remote.namespace)


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
        self._failed: str | None = None  # a pull failed (keep_going): this worker pulls no more

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = state["_view"] = None
        state["_reported"] = 0
        state["_names"] = None
        state["_dedupers"] = None
        state["_failed"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._names = itertools.count()

    # --- in the data worker -------------------------------------------------------------------
    def _connect(self) -> tuple[PSClient, FilterView | None]:
        """The worker's PS client and its view of the filter (None: the trainer withdrew the
        filter before this worker first looked, and fetches its rows itself)."""
        if self._client is None:
            p = self.ps
            self._client = PSClient(list(p.endpoints), p.timeout_s, p.heartbeat_s, auth_key=p.auth_key,
                                    link=p.link.shaper() if p.link is not None else None,
                                    namespace=p.namespace)
        if self._view is None:
            try:
                self._view = FilterView(self.layout)
            except FileNotFoundError:
                return self._client, None
        return self._client, self._view

    def encode(self, task: Any) -> tuple[Any, ...]:
        t0 = time.perf_counter()
        batch = self.reader.build(task)
        return self.encode_built(batch, t0, time.perf_counter())

    def encode_built(self, batch: SparseBatch, t0: float, t_built: float,
                     keep_going: bool = False) -> tuple[Any, ...]:
        """The message of a batch already built (between ``t0`` and ``t_built``): its samples
        with each table's dedup, and the cold rows pulled for it. A failed pull raises
        ``DeliveryError``; with ``keep_going`` the batch goes without the rows not pulled yet
        and its delivery names the error instead, as do this worker's later batches, which
        pull no more (a shared stream: one model's failure is that model's alone,
        ``cosparse.supply.models_codec``)."""
        client, view = self._connect()
        arrays: dict[str, np.ndarray] = {k: v for k, v in batch.to_arrays().items()
                                         if k in _SAMPLE_ARRAYS}
        if self._dedupers is None:
            self._dedupers = {t.name: Deduper() for t in self.tables}
        for task, y in (batch.task_labels or {}).items():  # several tasks' labels, weights
            arrays[f"t.{task}"] = y.numpy()
        if batch.weights is not None:
            arrays["weights"] = batch.weights.numpy()
        served = {f for t in self.tables for f in t.features}
        for key in batch.keys:  # a column no table reads travels as it is
            if key not in served:
                arrays[f"v.{key}"] = batch.feature(key)[0].numpy()
        error = self._failed
        for t in self.tables:
            ids, _ = table_parts(batch, t.features)
            unique, inverse = self._dedupers[t.name].unique(map_ids(ids, t.hash_size))
            arrays[f"i.{t.name}.unique"] = unique
            arrays[f"i.{t.name}.inverse"] = inverse.astype(np.int32)  # < 2^31 IDs per batch
            owned = unique if t.rows_of is None else \
                unique[row_owner(unique, t.rows_of[1]) == t.rows_of[0]]  # this rank's rows
            answer = None if error is not None or view is None else view.resident(t.name, owned)
            if answer is None:
                continue  # no consistent filter yet: the trainer fetches this table itself
            maybe_resident, _ = answer
            cold = np.sort(owned[~maybe_resident])  # delivered IDs are sorted
            if not cold.shape[0]:
                continue
            try:
                pulled = client.pull(t.remote_name or t.name, cold, with_state=True, peek=True)
            except (PSError, PSUnavailable) as e:  # refused, or the shard dead or silent
                error = (f"data worker pid {os.getpid()}: pulling {cold.shape[0]} rows of "
                         f"table '{t.name}' failed: {e}")
                if not keep_going:
                    raise DeliveryError(error) from None
                self._failed = error
                continue
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
                "negative_pool": batch.negative_pool, "pid": os.getpid(),
                "worker_ps_bytes": moved - self._reported,
                "payload": payload, "build_ms": (t_built - t0) * 1e3, "error": error,
                "worker_spans": [os.getpid(), [["build (read, featurize)", t0, t_built],
                                               ["dedup, filter, pull cold rows", t_built,
                                                time.perf_counter()]]]}
        self._reported = moved
        return ("shm", path, layout, meta)

    def _ids_of(self, arrays: dict[str, np.ndarray], keys: list[str]
                ) -> tuple[np.ndarray, dict[str, TableIds]]:
        """The ID columns (each table's as its row keys) and each table's ID work, from the
        tables' unique IDs and inverse indexes; the transposed bag index is built here."""
        lengths = arrays["lengths"]
        b = arrays["labels"].shape[0]
        per_key = lengths.reshape(len(keys), b) if keys else lengths.reshape(0, b)
        columns = {k: arrays[f"v.{k}"] for k in keys if f"v.{k}" in arrays}
        prepared = {}
        for t in self.tables:
            unique = arrays[f"i.{t.name}.unique"]
            inverse = arrays[f"i.{t.name}.inverse"].astype(np.int64)
            lens_of = [per_key[keys.index(f)] for f in t.features]
            bags = bag_offsets(np.concatenate(lens_of), inverse.shape[0], t.pooling)
            prepared[t.name] = with_bags(unique, inverse, bags, t.pooling == "mean")
            ids = unique[inverse]
            cuts = np.cumsum([lens.sum() for lens in lens_of])[:-1]
            columns.update(zip(t.features, np.split(ids, cuts), strict=True))
        values = (np.concatenate([columns[k] for k in keys]) if keys
                  else np.zeros(0, dtype=np.int64))
        return values, prepared

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # --- in the trainer -----------------------------------------------------------------------
    def decode(self, msg: tuple[Any, ...]) -> SparseBatch:
        _, path, layout, meta = msg
        arrays = read_arrays(path, layout)
        values, prepared = self._ids_of(arrays, meta["keys"])
        batch = SparseBatch.from_arrays({**{k: arrays[k] for k in _SAMPLE_ARRAYS},
                                         "values": values, "keys": meta["keys"],
                                         "bad_records": meta["bad_records"],
                                         "index": meta["index"],
                                         "dense_keys": meta.get("dense_keys"),
                                         "features_computed": meta.get("features_computed", 0),
                                         "build_ms": meta["build_ms"],
                                         "worker_spans": meta.get("worker_spans"),
                                         "task_labels": {k[2:]: v for k, v in arrays.items()
                                                         if k.startswith("t.")} or None,
                                         "weights": arrays.get("weights"),
                                         "negative_pool": meta.get("negative_pool", 0)})
        batch.prepared_ids = prepared
        delivery = Delivery(worker_ps_bytes=meta["worker_ps_bytes"], worker_pid=meta["pid"],
                            error=meta.get("error"))
        for t in self.tables:
            if f"d.{t.name}.ids" in arrays:
                delivery.rows[t.name] = DeliveredRows(*(arrays[f"d.{t.name}.{part}"] for part in
                                                        ("ids", "rows", "counters")))
        batch.delivery = delivery
        batch.wire_bytes = int(meta["payload"])
        return batch
