"""``data.stream`` follows a CSV file as it grows (issue 32, item 5): rows appended to a file
already trained are trained once, by byte offset (a partial last line waits until complete),
never the old rows again; a file truncated or rewritten below what was trained is refused,
naming it; a resumed run keeps every file's offset. Real files, a real data-worker process."""

from __future__ import annotations

import copy
import os
import time
from functools import partial
from pathlib import Path

import pytest
from test_stream import POLL, _raw, _rows, _xs, write_csv

from cosparse.config import config_from_mapping
from cosparse.data import BatchStream
from cosparse.data.errors import DataError
from cosparse.data.reader import NOT_YET
from cosparse.data.stream import StreamReader
from cosparse.train.inputs import stream_file_reader
from cosparse.train.trainer import Trainer


def _lines(start: int, n: int) -> str:
    cols = _rows(start, n)
    return "".join(f"{a},{b},{int(c)}\n" for a, b, c in zip(*cols.values(), strict=True))


def _append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def _reader(watch: Path, idle_timeout_s: float) -> tuple[StreamReader, list[str]]:
    cfg = config_from_mapping(_raw(watch, idle_timeout_s=idle_timeout_s))
    reader = StreamReader(cfg.data.stream, 8, partial(stream_file_reader, cfg.data), 5)
    logged: list[str] = []
    reader.log = logged.append
    return reader, logged


def test_rows_appended_to_a_trained_file_are_trained_once(tmp_path):
    """40 rows, then 40 more and half a line appended (the half line waits), then the line's
    rest and 7 more: every row once, in order, and the log names the appended rows."""
    f1 = write_csv(tmp_path, "f1.csv", 0, 40)
    reader, logged = _reader(tmp_path, idle_timeout_s=1.5)
    tail = _lines(80, 8)
    seen: list[int] = []
    appends = [tail[3:], _lines(40, 40) + tail[:3]]
    with BatchStream(reader, workers=1, queue_depth=2) as s:
        for b in s:
            seen += _xs([b])
            # f1 trained: append 40 rows and a partial line; those trained: finish the line,
            # and 7 more rows
            if seen[-1] in (39, 79) and appends:
                _append(f1, appends.pop())
            if len(seen) > 200:  # (the rows again and again)
                break
    assert seen == list(range(88))
    trained = [m for m in logged if "training" in m]
    assert trained == [f"data.stream: training {f1} (40 rows, 5 batches)",
                       f"data.stream: training {f1} rows 41..80: 40 rows appended since it was "
                       f"trained (bytes {len(_lines(0, 40)) + 10:,}..{len(_lines(0, 80)) + 10:,}"
                       ", 5 batches)",
                       f"data.stream: training {f1} rows 81..88: 8 rows appended since it was "
                       f"trained (bytes {len(_lines(0, 80)) + 10:,}..{f1.stat().st_size:,}, "
                       "1 batches)"], logged


@pytest.mark.parametrize("change, what", [
    (lambda p: os.truncate(p, p.stat().st_size - 20), "was truncated: it holds"),
    (lambda p: p.write_text(p.read_text().replace("u1,", "u9,") + _lines(20, 3)),
     "was rewritten: its first"),
])
def test_a_trained_file_truncated_or_rewritten_is_refused_naming_it(tmp_path, change, what):
    f1 = write_csv(tmp_path, "f1.csv", 0, 20)
    reader, _ = _reader(tmp_path, idle_timeout_s=3.0)
    size = f1.stat().st_size
    with pytest.raises(DataError, match=what) as e:
        with BatchStream(reader, workers=1, queue_depth=2) as s:
            for b in s:
                if _xs([b])[-1] == 19 and f1.stat().st_size == size:
                    time.sleep(POLL * 1.5)  # (a new mtime)
                    change(f1)
    assert str(f1) in str(e.value) and "only grow by appended lines" in str(e.value)


def test_a_resumed_stream_keeps_every_files_offset(tmp_path):
    """Run 1 trains a (finished) and stops in b; rows are appended to both while it is down;
    run 2 trains the rest of b and the appended rows of each: every row once (counted)."""
    watch = tmp_path / "in"
    watch.mkdir()
    a = write_csv(watch, "a.csv", 0, 16)  # 2 batches
    b = write_csv(watch, "b.csv", 16, 20)  # 3 batches
    os.utime(a, (time.time() - 10,) * 2)
    raw = _raw(watch, idle_timeout_s=1.0)
    raw["train"].update(steps=3, checkpoint={"dir": str(tmp_path / "ck")})
    t = Trainer(config_from_mapping(raw), log=print)
    try:
        t.run(evaluate=False)
        t.save()
        first = t.progressive.scored
        assert t.state.stream["file"] == "b.csv" and t.state.stream["rows"] == 8
        marks = t.state.stream.get("files")
    finally:
        t.close()
    assert first == 24
    size_a = a.stat().st_size
    _append(a, _lines(36, 5))
    _append(b, _lines(41, 4))
    raw2 = copy.deepcopy(raw)
    raw2["train"]["steps"] = 100
    t2 = Trainer(config_from_mapping(raw2), log=print)
    try:
        t2.resume(str(tmp_path / "ck"))
        t2.run()
    finally:
        t2.close()
    # b's rest (12) and its 4 appended, then a's 5 appended: none of a's first 16 again
    assert t2.progressive.scored == 12 + 4 + 5
    assert t2.state.stream["file"] == "a.csv" and t2.state.stream["rows"] == 21
    assert marks["a.csv"][:2] == [size_a, 16]  # (a's mark: its bytes and rows)


def test_a_checkpoint_without_offsets_resumes_after_its_batches(tmp_path):
    """A position written before offsets were kept (file, rows, batches) still resumes after
    the batches it trained."""
    f1 = write_csv(tmp_path, "f1.csv", 0, 20)
    reader, _ = _reader(tmp_path, idle_timeout_s=0.3)
    reader.resume({"file": "f1.csv", "mtime_ns": f1.stat().st_mtime_ns, "rows": 8, "batches": 1})
    tasks = [t for t in reader.tasks(1) if t is not NOT_YET]
    assert _xs([reader.build(t) for t in tasks]) == list(range(8, 20))
