"""Extract once, fan out: one data stream of the union of several models' features, handed to
each model's trainer as its own view.

The shared stream builds every batch once (in its data workers, where the feature extractor
computes each feature of the union exactly once). A model's view keeps the batch's IDs as they
are (a model's tables read only their own features, so nothing is copied) and takes its own dense
columns, by name and in its order. Counters: ``computed`` (feature computations, summed over the
batches the stream built) and ``served`` (features handed to models, summed over models). The
stream reads ahead of the models, so a run that stops mid-epoch built a few batches no model
trained on: ``computed`` is always ``batches`` times the features of the union. ``wire_bytes``
counts each batch message once (every model's own ``bytes.worker_trainer`` counts the messages
of the batches it trained on, which the models share).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from cosparse.batch import SparseBatch
from cosparse.data import BatchStream
from cosparse.data.reader import Reader
from cosparse.train.inputs import WORKER_PRELOAD

_END = object()


class FanOutClosed(RuntimeError):
    """The shared stream was stopped (another model failed, or the run was interrupted): the
    models still reading stop with this error, never as if their epoch had ended."""


@dataclass(frozen=True)
class ConsumerView:
    """What one model takes of a union batch: its sparse features and its dense columns."""

    name: str
    sparse: tuple[str, ...]
    dense: tuple[str, ...]

    @property
    def num_features(self) -> int:
        return len(self.sparse) + len(self.dense)

    def select(self, batch: SparseBatch) -> SparseBatch:
        names = batch.dense_keys or []
        missing = [d for d in self.dense if d not in names]
        if missing:
            raise ValueError(f"model '{self.name}': the batch has no dense features {missing} "
                             f"(it has {names})")
        idx = [names.index(d) for d in self.dense]
        dense = batch.dense[:, idx] if idx != list(range(len(names))) else batch.dense
        return SparseBatch(batch.keys, batch.values, batch.lengths, dense, batch.labels,
                           batch.bad_records, batch.index, _offsets=batch._offsets,
                           wire_bytes=batch.wire_bytes, dense_keys=list(self.dense),
                           features_computed=batch.features_computed, build_ms=batch.build_ms)


class ViewReader:
    """A Reader over a union reader that builds each batch and hands back one model's view
    (the model's trainer uses it to size its tiers and to evaluate)."""

    def __init__(self, union: Reader, view: ConsumerView) -> None:
        self.union = union
        self.view = view
        self.keys = list(view.sparse)
        self.num_dense = len(view.dense)

    @property
    def num_batches(self) -> int:
        return self.union.num_batches

    def tasks(self, start_batch: int = 0) -> Iterator[Any]:
        return self.union.tasks(start_batch)

    def build(self, task: Any) -> SparseBatch:
        return self.view.select(self.union.build(task))


@dataclass
class _Round:
    """One pass over the shared stream (an epoch), feeding every consumer still reading."""

    start_batch: int
    queues: dict[str, queue.Queue]
    open: set[str]
    stream: BatchStream | None = None
    thread: threading.Thread | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class FanOut:
    """Hands the batches of one shared stream over ``reader`` to every view, in order; each
    consumer asks for a stream per epoch (``stream(name, start_batch)``), and all consumers of
    an epoch must start at the same batch."""

    def __init__(self, reader: Reader, views: list[ConsumerView], workers: int,
                 queue_depth: int) -> None:
        self.reader = reader
        self.views = {v.name: v for v in views}
        self.workers = workers
        self.queue_depth = queue_depth
        self.computed = 0
        self.served = 0
        self.batches = 0
        self.wire_bytes = 0  # worker->trainer bytes of the shared stream, each message once
        self.worker_pids: set[int] = set()  # every data-worker process the stream started
        self._rounds: list[_Round] = []
        self._opened = dict.fromkeys(self.views, 0)
        self._dropped: set[str] = set()  # consumers that stopped for good (a failed model)
        self._lock = threading.Lock()
        self._closed = False

    def stream(self, name: str, start_batch: int) -> ConsumerStream:
        with self._lock:
            if self._closed:
                raise FanOutClosed(f"model '{name}': the shared data stream was stopped")
            r = self._opened[name]
            self._opened[name] += 1
            if r == len(self._rounds):
                rnd = _Round(start_batch, {n: queue.Queue(self.queue_depth) for n in self.views},
                             set(self.views) - self._dropped)
                self._rounds.append(rnd)
                rnd.stream = BatchStream(self.reader, self.workers, self.queue_depth,
                                         start_batch=start_batch, preload=WORKER_PRELOAD)
                self.worker_pids.update(rnd.stream.pids)
                rnd.thread = threading.Thread(target=self._feed, args=(rnd,), daemon=True,
                                              name=f"cosparse-fanout-{r}")
                rnd.thread.start()
            rnd = self._rounds[r]
            if rnd.start_batch != start_batch:
                raise RuntimeError(f"model '{name}' starts epoch {r} at batch {start_batch}, "
                                   f"the others at {rnd.start_batch}: the models must train in "
                                   "step (resume them from checkpoints of the same step)")
        return ConsumerStream(self, rnd, name)

    def _feed(self, rnd: _Round) -> None:
        assert rnd.stream is not None
        try:
            for batch in rnd.stream:
                with rnd.lock:
                    readers = sorted(rnd.open)
                if not readers or self._closed:
                    break
                with self._lock:  # rounds of two epochs may feed at once
                    self.computed += batch.features_computed
                    self.batches += 1
                    self.wire_bytes += batch.wire_bytes
                for name in readers:
                    view = self.views[name]
                    if self._put(rnd, name, view.select(batch)):
                        with self._lock:
                            self.served += view.num_features
            end: object = _END
        except BaseException as e:  # noqa: BLE001 - handed to every consumer
            end = e
        finally:
            rnd.stream.close()
        for name in list(rnd.open):
            self._put(rnd, name, end)

    def _put(self, rnd: _Round, name: str, item: object) -> bool:
        """Hand ``item`` to a consumer; False when it stopped reading first."""
        q = rnd.queues[name]
        while True:
            with rnd.lock:
                if name not in rnd.open or self._closed:
                    return False
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue

    def _leave(self, rnd: _Round, name: str) -> None:
        with rnd.lock:
            rnd.open.discard(name)
        q = rnd.queues[name]
        while True:  # unblock the feeder
            try:
                q.get_nowait()
            except queue.Empty:
                break

    def drop(self, name: str) -> None:
        """Consumer ``name`` reads no more, in this round or any later one (a failed model): the
        others go on without waiting for it."""
        with self._lock:
            self._dropped.add(name)
            rounds = list(self._rounds)
        for rnd in rounds:
            self._leave(rnd, name)

    def close(self) -> None:
        """Stop every round's stream and feeder (safe to call twice): the models still reading
        get ``FanOutClosed``. A stream's own ``close`` may be called from another thread."""
        with self._lock:
            self._closed = True
        for rnd in list(self._rounds):
            with rnd.lock:
                rnd.open.clear()
            if rnd.stream is not None:
                rnd.stream.close()
            if rnd.thread is not None:
                rnd.thread.join(timeout=30)


class ConsumerStream:
    """One model's iterator over a round of the shared stream (what its trainer reads)."""

    def __init__(self, fanout: FanOut, rnd: _Round, name: str) -> None:
        self._fanout = fanout
        self._round = rnd
        self._name = name
        self._done = False

    @property
    def pids(self) -> list[int]:
        return [] if self._round.stream is None else self._round.stream.pids

    def __iter__(self) -> ConsumerStream:
        return self

    def __next__(self) -> SparseBatch:
        if self._done:
            raise StopIteration
        q = self._round.queues[self._name]
        while True:
            try:
                item = q.get(timeout=0.1)
                break
            except queue.Empty:
                if self._fanout._closed:
                    self.close()
                    raise FanOutClosed(f"model '{self._name}': the shared data stream was "
                                       "stopped") from None
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item
        return item

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._fanout._leave(self._round, self._name)
