"""The data a trainer trains from: its batch stream (kept open between ``run`` calls), this rank's
part of each global batch, and a stream's heartbeat while it waits for files.

A role of ``cosparse.train.trainer.Trainer``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cosparse.data import BatchStream
from cosparse.parallel.data import local_parts
from cosparse.train.inputs import (
    WORKER_PRELOAD,
)
from cosparse.train.prefetch import Prefetcher


class StreamRole:
    """The training data stream for ``Trainer``."""

    def _open_stream(self) -> Any:
        """The data stream from the current batch on: the one the last run left open when it
        stands there (its workers are warm and have read ahead), else a new one."""
        kept, self._kept = self._kept, None
        if kept is not None:
            stream, epoch, batch = kept
            if (epoch, batch) == (self.state.epoch, self.state.batch_in_epoch) \
                    and not stream.closed:
                return stream
            stream.close()  # (a restore moved the position)
        if self.stream_factory:
            return self.stream_factory(self.state.batch_in_epoch)
        cfg = self.cfg
        return BatchStream(
            self.train_reader, cfg.data.workers, cfg.data.queue_depth,
            start_batch=self.state.batch_in_epoch, codec=self.path.codec,
            link=self.links.worker_trainer, preload=WORKER_PRELOAD,
        )

    def _mine(self, batches: Any) -> Any:
        """This rank's samples of each global batch (all of them on one process)."""
        if self.ranks is None:
            return batches
        return local_parts(batches, self.ranks.world.rank, self.ranks.world.size,
                           self.ranks.balance)

    def _beater(self, prefetch: Prefetcher) -> Callable[[str], None]:
        """A stream's heartbeat while it waits for files: the prefetch thread's and the
        trainer's progress (the waits on either see a live run)."""
        mine = self.progress  # (not the trainer itself: the reader keeps this, no cycle)

        def beat(what: str) -> None:
            prefetch.progress.beat(what)
            mine.beat(what)
        return beat
