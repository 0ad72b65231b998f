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

import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from cosparse.batch import SparseBatch
from cosparse.data import BatchStream
from cosparse.data.codec import BatchCodec
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


_AWAY_BATCHES = 64  # batches a model that stepped away (stream closed) may fall behind


@dataclass
class _Seat:
    """One consumer's place in a round: the batches fed to it and not yet read, the last ones
    it read (replayed when it opens the round again mid-way: its trainer fell back and plans
    again from its last trained batch), and whether it is reading now."""

    replay: int
    position: int  # the round's batch index of the next batch it reads
    waiting: deque = field(default_factory=deque)
    handed: deque = field(default_factory=deque)  # (position, batch), the last `replay` read
    present: bool = True
    ended: bool = False  # it read the round's end (or its error)
    gone: str | None = None  # why it reads no more of this round


@dataclass
class _Round:
    """One pass over the shared stream (an epoch), feeding every consumer still reading."""

    start_batch: int
    seats: dict[str, _Seat]
    stream: BatchStream | None = None
    thread: threading.Thread | None = None
    cond: threading.Condition = field(default_factory=threading.Condition)


class FanOut:
    """Hands the batches of one shared stream over ``reader`` to every view, in order; each
    consumer asks for a stream per epoch (``stream(name, start_batch)``), and all consumers of
    an epoch must start at the same batch. A consumer that closes its stream mid-epoch and
    opens it again (a model falling back to its own pulls) carries on from the batch it names,
    up to ``replay`` batches back. ``codec()``, when given, is each round's batch codec (several
    models under architecture B: ``cosparse.supply.models_codec``)."""

    def __init__(self, reader: Reader, views: list[ConsumerView], workers: int,
                 queue_depth: int, codec: Callable[[], BatchCodec | None] | None = None,
                 replay: int = 16) -> None:
        self.reader = reader
        self.views = {v.name: v for v in views}
        self.workers = workers
        self.queue_depth = max(1, queue_depth)
        self.codec = codec
        self.replay = replay
        self.computed = 0
        self.served = 0
        self.batches = 0
        self.wire_bytes = 0  # worker->trainer bytes of the shared stream, each message once
        self.worker_pids: set[int] = set()  # every data-worker process the stream started
        self._rounds: list[_Round] = []
        self._current: dict[str, int] = {}  # the round each consumer reads
        self._dropped: set[str] = set()  # consumers that stopped for good (a failed model)
        self._lock = threading.Lock()
        self._closed = False

    def stream(self, name: str, start_batch: int) -> ConsumerStream:
        with self._lock:
            if self._closed:
                raise FanOutClosed(f"model '{name}': the shared data stream was stopped")
            r = self._current.get(name)
            if r is not None and not self._rounds[r].seats[name].ended:
                rnd = self._rounds[r]
                self._rejoin(rnd, name, start_batch)
                return ConsumerStream(self, rnd, name)
            r = 0 if r is None else r + 1
            self._current[name] = r
            if r == len(self._rounds):
                self._rounds.append(self._open_round(r, start_batch))
            rnd = self._rounds[r]
            if rnd.start_batch != start_batch:
                raise RuntimeError(f"model '{name}' starts epoch {r} at batch {start_batch}, "
                                   f"the others at {rnd.start_batch}: the models must train in "
                                   "step (resume them from checkpoints of the same step)")
        return ConsumerStream(self, rnd, name)

    def _open_round(self, r: int, start_batch: int) -> _Round:
        seats = {n: _Seat(self.replay, start_batch) for n in self.views if n not in self._dropped}
        rnd = _Round(start_batch, seats)
        rnd.stream = BatchStream(self.reader, self.workers, self.queue_depth,
                                 start_batch=start_batch, preload=WORKER_PRELOAD,
                                 codec=self.codec() if self.codec is not None else None)
        self.worker_pids.update(rnd.stream.pids)
        rnd.thread = threading.Thread(target=self._feed, args=(rnd,), daemon=True,
                                      name=f"cosparse-fanout-{r}")
        rnd.thread.start()
        return rnd

    def _rejoin(self, rnd: _Round, name: str, start_batch: int) -> None:
        """Consumer ``name`` reads its round again from ``start_batch``: the batches it read
        from there on are handed again first."""
        with rnd.cond:
            seat = rnd.seats[name]
            if seat.gone is not None:
                raise RuntimeError(f"model '{name}' cannot read the shared stream again: "
                                   f"{seat.gone}")
            again = [(p, b) for p, b in seat.handed if p >= start_batch]
            first = again[0][0] if again else seat.position
            if first != start_batch:
                raise RuntimeError(
                    f"model '{name}' opens the shared stream again at batch {start_batch}, but "
                    f"the fan-out kept its batches from {first} to {seat.position - 1} only "
                    f"(the last {seat.replay} it read)")
            seat.handed = deque((p, b) for p, b in seat.handed if p < start_batch)
            seat.waiting.extendleft(b for _, b in reversed(again))
            seat.position = start_batch
            seat.present = True
            rnd.cond.notify_all()

    def _feed(self, rnd: _Round) -> None:
        assert rnd.stream is not None
        try:
            for batch in rnd.stream:
                with rnd.cond:  # nobody reading now (the models ended, or all stepped away):
                    while not self._closed and not any(  # build no further ahead
                            s.present for s in rnd.seats.values() if s.gone is None) and any(
                            s.gone is None for s in rnd.seats.values()):
                        rnd.cond.wait(0.1)
                    readers = sorted(n for n, s in rnd.seats.items() if s.gone is None)
                if not readers or self._closed:
                    break
                with self._lock:  # rounds of two epochs may feed at once
                    self.computed += batch.features_computed
                    self.batches += 1
                    self.wire_bytes += batch.wire_bytes
                parts = batch.parts or {}
                for name in readers:
                    view = self.views[name]
                    own = parts[name] if name in parts else view.select(batch)
                    if self._put(rnd, name, own):
                        with self._lock:
                            self.served += view.num_features
            end: object = _END
        except BaseException as e:  # noqa: BLE001 - handed to every consumer
            end = e
        finally:
            rnd.stream.close()
        for name in list(rnd.seats):
            self._put(rnd, name, end)

    def _put(self, rnd: _Round, name: str, item: object) -> bool:
        """Hand ``item`` to a consumer (waiting while it is reading and has ``queue_depth``
        batches unread); False when it reads no more of this round. A consumer away (its
        stream closed) is not waited for: it falls behind by at most ``_AWAY_BATCHES``."""
        with rnd.cond:
            seat = rnd.seats[name]
            while seat.present and len(seat.waiting) >= self.queue_depth:
                if seat.gone is not None or self._closed:
                    return False
                rnd.cond.wait(0.1)
            if seat.gone is not None or self._closed:
                return False
            if not seat.present and len(seat.waiting) >= _AWAY_BATCHES:
                seat.gone = (f"it stepped away from the shared stream and fell "
                             f"{_AWAY_BATCHES} batches behind the others")
                seat.waiting.clear()
                return False
            seat.waiting.append(item)
            rnd.cond.notify_all()
            return True

    def drop(self, name: str) -> None:
        """Consumer ``name`` reads no more, in this round or any later one (a failed model): the
        others go on without waiting for it."""
        with self._lock:
            self._dropped.add(name)
            rounds = list(self._rounds)
        for rnd in rounds:
            with rnd.cond:
                if name in rnd.seats:
                    rnd.seats[name].gone = "it was dropped (it failed)"
                    rnd.seats[name].waiting.clear()
                rnd.cond.notify_all()

    def close(self) -> None:
        """Stop every round's stream and feeder (safe to call twice): the models still reading
        get ``FanOutClosed``. A stream's own ``close`` may be called from another thread."""
        with self._lock:
            self._closed = True
        for rnd in list(self._rounds):
            with rnd.cond:
                for seat in rnd.seats.values():
                    seat.waiting.clear()
                    seat.handed.clear()
                rnd.cond.notify_all()
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
        rnd = self._round
        with rnd.cond:
            seat = rnd.seats[self._name]
            while True:
                if self._done:  # closed from another thread: never take a batch after that
                    raise StopIteration
                if seat.waiting:
                    break
                if self._fanout._closed or seat.gone is not None:
                    self._done = True
                    seat.present = False
                    raise FanOutClosed(f"model '{self._name}': the shared data stream was "
                                       "stopped") from None
                rnd.cond.wait(0.1)
            item = seat.waiting.popleft()
            rnd.cond.notify_all()
            if item is _END or isinstance(item, BaseException):
                seat.ended = True
            else:
                seat.handed.append((seat.position, item))
                while len(seat.handed) > seat.replay:
                    seat.handed.popleft()
                seat.position += 1
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item
        return item  # type: ignore[return-value]

    def close(self) -> None:
        """This model stops reading for now (it may open the round again, or never)."""
        with self._round.cond:
            if not self._done:
                self._done = True
                self._round.seats[self._name].present = False
                self._round.cond.notify_all()
