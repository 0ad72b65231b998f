"""The reader interface shared by every data source, and ``make_reader`` from a DataConfig.

A reader splits its stream into small picklable *tasks* in batch order (cheap, in the main process)
and *builds* one SparseBatch per task (pure, in a worker process or in-process). A source of
files that are still arriving (``data.stream``) may yield ``NOT_YET`` among its tasks: nothing is
ready now, and the stream delivers what it has and asks again a little later.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

from cosparse.batch import SparseBatch
from cosparse.config import DataConfig
from cosparse.data.split import Split


class _NotYet:
    """The type of ``NOT_YET``."""

    def __repr__(self) -> str:
        return "NOT_YET"


NOT_YET = _NotYet()  # a task source's "no task ready yet, ask again" (never a task itself)


@runtime_checkable
class Reader(Protocol):
    """A source of SparseBatches. ``SparseBatch.index`` is the batch position in the stream."""

    keys: list[str]
    num_dense: int

    @property
    def num_batches(self) -> int:
        """Batches in this stream (the last may be partial)."""
        ...

    def tasks(self, start_batch: int = 0) -> Iterator[Any]:
        """Picklable work items in batch order, from batch ``start_batch`` on."""
        ...

    def build(self, task: Any) -> SparseBatch:
        """The SparseBatch of one task; pure, so it may run in any process."""
        ...


def make_reader(cfg: DataConfig, split: Split = "train") -> Reader:
    """The reader that ``cfg.reader`` names, for ``split`` ("train" or "eval")."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    if cfg.reader == "synthetic":
        from cosparse.data.synthetic import SyntheticReader

        return SyntheticReader(cfg.synthetic, cfg.batch_size, split)
    if cfg.reader == "synthetic_sequences":
        from cosparse.data.synthetic_sequences import SyntheticSequenceReader

        return SyntheticSequenceReader(cfg.events.synthetic, cfg.batch_size, split)
    if cfg.path is None:
        raise ValueError(f"data.path: reader '{cfg.reader}' needs a path")
    if cfg.reader == "criteo_tsv":
        from cosparse.data.criteo import CriteoTSVReader

        return CriteoTSVReader(
            cfg.path, cfg.batch_size, split, cfg.eval_fraction, cfg.on_bad_record, cfg.shuffle
        )
    if cfg.reader == "parquet":
        from cosparse.data.parquet import ParquetReader

        return ParquetReader(cfg.path, cfg.batch_size, split, cfg.eval_fraction, cfg.on_bad_record,
                             cfg.shuffle)
    if cfg.reader == "taobao_events":
        from cosparse.data.events import TaobaoEventsReader

        return TaobaoEventsReader(cfg.path, cfg.batch_size, split, cfg.eval_fraction,
                                  cfg.on_bad_record, cfg.events, cfg.shuffle,
                                  cfg.columns.labels if cfg.columns else None)
    raise ValueError(f"data.reader: unknown reader {cfg.reader!r}")
