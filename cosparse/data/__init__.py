"""Data readers (Criteo TSV, Parquet, synthetic Zipf) and the worker pool that builds batches.

``make_reader(cfg, split)`` gives a Reader; ``BatchStream(reader, workers, queue_depth)`` iterates
its SparseBatches in order, in-process or from worker processes. Bad input raises ``DataError``.
"""

from cosparse.data.criteo import CriteoTask, CriteoTSVReader
from cosparse.data.errors import DataError
from cosparse.data.parquet import ParquetReader, ParquetTask, write_criteo_parquet
from cosparse.data.pool import BatchStream
from cosparse.data.reader import Reader, make_reader
from cosparse.data.synthetic import SyntheticReader

__all__ = [
    "BatchStream",
    "CriteoTSVReader",
    "CriteoTask",
    "DataError",
    "ParquetReader",
    "ParquetTask",
    "Reader",
    "SyntheticReader",
    "make_reader",
    "write_criteo_parquet",
]
