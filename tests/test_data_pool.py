"""BatchStream: ordered delivery for any worker count, resume, errors and worker shutdown."""

from __future__ import annotations

import gc
import gzip
import multiprocessing as mp
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from cosparse.batch import SparseBatch
from cosparse.config import SyntheticConfig
from cosparse.data import BatchStream, CriteoTSVReader, DataError, SyntheticReader

CRITEO = Path(__file__).resolve().parents[2] / "shared/data/criteo/train_head10k.txt"


@pytest.fixture
def criteo() -> Path:
    if not CRITEO.is_file():
        pytest.skip(f"{CRITEO} not present")
    return CRITEO


@pytest.fixture(autouse=True)
def no_leftover_workers() -> Iterator[None]:
    yield
    gc.collect()
    assert [p for p in mp.active_children() if p.name.startswith("cosparse-data")] == []


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in status


def assert_same_seq(a: list[SparseBatch], b: list[SparseBatch]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.index == y.index and x.keys == y.keys and x.bad_records == y.bad_records
        for f in ("values", "lengths", "dense", "labels"):
            assert torch.equal(getattr(x, f), getattr(y, f)), f


def synthetic() -> SyntheticReader:
    cfg = SyntheticConfig(num_features=4, num_dense=3, vocab_size=5000, bag_min=1, bag_max=3,
                          num_batches=7, eval_batches=2)
    return SyntheticReader(cfg, 128)


def lines(path: Path, n: int) -> list[str]:
    with open(path) as f:
        return [next(f).rstrip("\n") for _ in range(n)]


def test_synthetic_same_sequence_for_any_worker_count() -> None:
    r = synthetic()
    ref = list(BatchStream(r, workers=0))
    assert [b.index for b in ref] == list(range(7))
    for w in (1, 2):
        with BatchStream(r, workers=w, queue_depth=2) as s:
            got = list(s)
        assert_same_seq(ref, got)
        assert s.delivered == 7 and s.closed and s.pids == []


def test_criteo_same_sequence_for_any_worker_count(criteo: Path) -> None:
    r = CriteoTSVReader(criteo, 2000, "train", 0.2)
    ref = list(BatchStream(r, workers=0))
    assert [b.batch_size for b in ref] == [2000] * 4
    for w in (1, 2):
        s = BatchStream(r, workers=w, queue_depth=1)
        got = list(s)
        assert_same_seq(ref, got)
        assert s.stats()["batches"] == 4 and s.wait_ms >= 0.0


def test_start_batch_resumes(criteo: Path) -> None:
    r = synthetic()
    ref = list(BatchStream(r, workers=0))
    with BatchStream(r, workers=2, queue_depth=2, start_batch=4) as s:
        assert_same_seq(ref[4:], list(s))
    c = CriteoTSVReader(criteo, 700, "eval", 0.2)
    cref = list(BatchStream(c, workers=0))
    with BatchStream(c, workers=2, queue_depth=1, start_batch=1) as s:
        assert_same_seq(cref[1:], list(s))


def test_worker_error_names_file_and_line(criteo: Path, tmp_path: Path) -> None:
    rows = lines(criteo, 30)
    fields = rows[16].split("\t")
    fields[3] = "abc"
    rows[16] = "\t".join(fields)
    p = tmp_path / "bad.txt"
    p.write_text("\n".join(rows) + "\n")
    s = BatchStream(CriteoTSVReader(p, 5, "train", 0.0), workers=2, queue_depth=2)
    pids = s.pids
    assert len(pids) == 2
    got = []
    with pytest.raises(DataError, match=re.escape(f"{p}:17: non-numeric integer field I3 'abc'")):
        for b in s:
            got.append(b.index)
    assert got == [0, 1, 2]  # the batches before the bad one are delivered, in order
    assert s.closed and not any(alive(pid) for pid in pids)
    skip = BatchStream(CriteoTSVReader(p, 5, "train", 0.0, "skip"), workers=2, queue_depth=2)
    assert sum(b.batch_size for b in skip) == 29 and skip.bad_records == 1


def test_close_early_and_gc_stop_workers() -> None:
    s = BatchStream(synthetic(), workers=2, queue_depth=2)
    next(s)
    pids = s.pids
    assert all(alive(pid) for pid in pids)
    s.close()
    assert not any(alive(pid) for pid in pids) and s.pids == []
    with pytest.raises(StopIteration):
        next(s)
    s2 = BatchStream(synthetic(), workers=1, queue_depth=1)
    next(s2)
    pids = s2.pids
    del s2
    gc.collect()
    assert not any(alive(pid) for pid in pids)


def test_truncated_gzip_through_stream(criteo: Path, tmp_path: Path) -> None:
    data = gzip.compress(("\n".join(lines(criteo, 400)) + "\n").encode())
    p = tmp_path / "cut.txt.gz"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="truncated"):
        s = BatchStream(CriteoTSVReader(p, 50, "train", 0.0), workers=1, queue_depth=1)
        list(s)


def test_fork_is_refused() -> None:
    with pytest.raises(ValueError, match="fork"):
        BatchStream(synthetic(), workers=1, start_method="fork")


class CrashingReader(SyntheticReader):
    """Its worker process dies hard on batch 2."""

    def build(self, task: int) -> SparseBatch:
        if task == 2:
            os._exit(3)
        return super().build(task)


def test_dead_worker_is_reported() -> None:
    r = CrashingReader(synthetic().cfg, 64)
    s = BatchStream(r, workers=2, queue_depth=1)
    pids = s.pids
    assert [next(s).index, next(s).index] == [0, 1]
    with pytest.raises(RuntimeError, match="exited with code 3"):
        next(s)
    assert s.closed and not any(alive(pid) for pid in pids)
