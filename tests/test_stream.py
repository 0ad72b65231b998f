"""``data.stream``: training on the files arriving in a watched directory. Real files written into a
tmp dir before and during the runs, real data-worker processes: files that arrive during a run
are trained, a file is taken only once complete, an idle stream is alive (never a stall) and
ends on its idle timeout, a stopped run resumes after the last file and row it trained (every
row once: counted), checkpoints by time, progressive-validation metrics, and the config's
refusals."""

from __future__ import annotations

import copy
import gc
import json
import multiprocessing as mp
import os
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cosparse.config import ConfigError, StreamConfig, config_from_mapping
from cosparse.data import BatchStream
from cosparse.data.reader import NOT_YET
from cosparse.data.stream import StreamReader
from cosparse.data.watch import Arrival, DirWatch
from cosparse.train.checkpoint import checkpoints, read_meta
from cosparse.train.inputs import model_inputs
from cosparse.train.trainer import Trainer

POLL = 0.1


@pytest.fixture(autouse=True)
def no_leftover_workers():
    """Every data worker a test started is gone after it."""
    yield
    gc.collect()
    assert [p for p in mp.active_children() if p.name.startswith("cosparse-data")] == []


def _rows(start: int, n: int) -> dict[str, list]:
    """Rows ``start .. start + n - 1``: column ``x`` is the row's number (a dense input, so a
    batch says exactly which rows it holds)."""
    i = np.arange(start, start + n)
    return {"label": ((i * 7) % 3 == 0).astype(np.int64).tolist(),
            "u": [f"u{k % 5}" for k in i], "x": i.astype(np.float64).tolist()}


def write_csv(d: Path, name: str, start: int, n: int) -> Path:
    """A CSV file written under a .tmp name, then renamed (the documented writer)."""
    cols = _rows(start, n)
    lines = ["label,u,x"] + [f"{a},{b},{int(c)}" for a, b, c in zip(*cols.values(), strict=True)]
    tmp = d / f"{name}.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, d / name)
    return d / name


def write_parquet(d: Path, name: str, start: int, n: int) -> Path:
    tmp = d / f".{name}"  # (a hidden name: never taken)
    pq.write_table(pa.table(_rows(start, n)), tmp)
    os.replace(tmp, d / name)
    return d / name


def _raw(watch: Path, reader: str = "csv", **stream) -> dict:
    return {
        "data": {"reader": reader, "batch_size": 8, "columns": {"dense": ["x"]},
                 "stream": {"watch": str(watch), "pattern": f"*.{reader}", "poll_s": POLL,
                            **stream}},
        "model": {"kind": "dlrm", "bottom": [4], "top": [4, 1]},
        "tables": [{"name": "t", "dim": 4, "features": "auto"}],
        "train": {"steps": 1000, "log_every": 2, "eval_every": 3, "progress": False},
    }


def _later(delay_s: float, fn, *args) -> threading.Thread:
    def run() -> None:
        time.sleep(delay_s)
        fn(*args)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _where(position: dict) -> dict:
    """A stream position's file, mtime, rows and batches (not its offsets and marks)."""
    return {k: position[k] for k in ("file", "mtime_ns", "rows", "batches")}


def _xs(batches) -> list[int]:
    """The row numbers of ``batches``, in order (their one dense column)."""
    return [int(v) for b in batches for v in b.dense.numpy()[:, 0]]


# --- the watch: when a file is complete, and in which order -------------------------------------
def _poll_until(watch: DirWatch, want: int, timeout_s: float = 5.0) -> list[Arrival]:
    got: list[Arrival] = []
    t0 = time.monotonic()
    while len(got) < want and time.monotonic() - t0 < timeout_s:
        got += watch.poll()
        time.sleep(POLL / 4)
    return got


def test_a_file_is_taken_once_complete_in_mtime_then_name_order(tmp_path):
    warned: list[str] = []
    watch = DirWatch(tmp_path, "*.csv", POLL, warn=warned.append)
    # a file still being written (it grows at every poll) is not taken
    growing = tmp_path / "growing.csv"
    with open(growing, "w") as f:
        for k in range(6):  # a write between every two listings
            f.write(f"row {k}\n")
            f.flush()
            time.sleep(POLL * 1.2)
            assert watch.poll() == [], f"taken while growing (write {k})"
    # .tmp and hidden names never are; a complete file is, after one stable poll
    (tmp_path / "b.csv.tmp").write_text("x\n")
    (tmp_path / ".c.csv").write_text("x\n")
    (tmp_path / "other.txt").write_text("x\n")
    got = _poll_until(watch, 1)
    assert [a.name for a in got] == ["growing.csv"]
    # two files of one mtime: by name; an older mtime first
    t = time.time()
    for name, mtime in (("z.csv", t - 5), ("m.csv", t - 5), ("a.csv", t - 3)):
        (tmp_path / name).write_text("x\n")
        os.utime(tmp_path / name, (mtime, mtime))
    # (the mtimes above are before the watermark, growing.csv's: late files, reported)
    time.sleep(POLL * 3)
    assert _poll_until(watch, 1, timeout_s=POLL * 4) == []
    assert len(warned) == 3 and all("touch it" in w for w in warned)
    watch2 = DirWatch(tmp_path, "*.csv", POLL)  # a fresh watch (no watermark): all of them
    got = _poll_until(watch2, 4)
    assert [a.name for a in got] == ["m.csv", "z.csv", "a.csv", "growing.csv"]
    # a resumed watch takes only the files after its watermark
    watch3 = DirWatch(tmp_path, "*.csv", POLL, after=got[1])
    assert [a.name for a in _poll_until(watch3, 2)] == ["a.csv", "growing.csv"]


# --- the reader: batches per file in order, real workers, positions ------------------------------
def test_the_stream_reader_trains_every_row_once_through_worker_processes(tmp_path):
    from functools import partial

    from cosparse.train.inputs import stream_file_reader

    write_csv(tmp_path, "f1.csv", 0, 20)
    # (f2 arrives 0.6 s in: the idle bound leaves room for a loaded host's process starts)
    raw = _raw(tmp_path, idle_timeout_s=4.0)
    cfg = config_from_mapping(raw)
    open_file = partial(stream_file_reader, cfg.data)
    reader = StreamReader(cfg.data.stream, 8, open_file, first_wait_s=5)
    assert reader.keys == ["u"] and reader.num_dense == 1
    _later(0.6, write_csv, tmp_path, "f2.csv", 20, 11)
    with BatchStream(reader, workers=2, queue_depth=2) as s:
        batches = list(s)
        assert len(s.pids) == 0  # (stopped at the end)
    assert _xs(batches) == list(range(31))
    assert [b.index for b in batches] == list(range(5))  # (3 batches of f1, 2 of f2)
    # the positions the trainer takes: after batch 3, f2's first batch is done
    for i in range(4):
        pos = reader.position_after(i)
    assert _where(pos) == {"file": "f2.csv", "mtime_ns": os.stat(tmp_path / "f2.csv").st_mtime_ns,
                   "rows": 8, "batches": 1}
    # resumed there: the rest of f2, then a new file
    write_csv(tmp_path, "f3.csv", 31, 5)
    reader.resume(pos)
    with BatchStream(reader, workers=1, queue_depth=2, start_batch=4) as s:
        rest = list(s)
    assert _xs(rest) == list(range(28, 36))
    assert [b.index for b in rest] == [4, 5]


def test_an_idle_stream_yields_not_yet_and_beats_until_its_idle_timeout(tmp_path):
    write_csv(tmp_path, "f1.csv", 0, 4)
    cfg = config_from_mapping(_raw(tmp_path, idle_timeout_s=0.8))
    from functools import partial

    from cosparse.train.inputs import stream_file_reader

    reader = StreamReader(cfg.data.stream, 8, partial(stream_file_reader, cfg.data), 5)
    beats: list[str] = []
    reader.heartbeat = beats.append
    t0 = time.monotonic()
    tasks = list(reader.tasks())
    took = time.monotonic() - t0
    real = [t for t in tasks if t is not NOT_YET]
    assert len(real) == 1 and len(tasks) - 1 == len(beats) >= 2
    assert 0.8 <= took < 3.0
    assert "waiting for files matching '*.csv'" in beats[0]


CRITEO = Path(__file__).resolve().parents[2] / "shared/data/criteo/train_head10k.txt"


def test_criteo_column_parquet_files_stream_without_data_columns(tmp_path):
    """``reader: parquet`` without ``data.columns``: the Criteo columns, file after file."""
    if not CRITEO.is_file():
        pytest.skip(f"{CRITEO} not present")
    from cosparse.data.columns import CRITEO_KEYS
    from cosparse.data.parquet import read_criteo_tsv_table

    table = read_criteo_tsv_table(CRITEO, rows=300)
    for k, (lo, n) in enumerate(((0, 100), (100, 200))):
        tmp = tmp_path / f"part{k}.parquet.tmp"
        pq.write_table(table.slice(lo, n), tmp)
        os.replace(tmp, tmp_path / f"part{k}.parquet")
        os.utime(tmp_path / f"part{k}.parquet", (time.time() - 10 + k,) * 2)
    raw = _raw(tmp_path, "parquet", idle_timeout_s=0.5)
    raw["data"].update(columns=None, batch_size=64)
    raw["tables"] = [{"name": "t", "dim": 4, "features": list(CRITEO_KEYS)}]
    inputs = model_inputs(config_from_mapping(raw))
    assert inputs.train.keys == list(CRITEO_KEYS) and inputs.train.num_dense == 13
    with BatchStream(inputs.train, workers=1) as s:
        batches = list(s)
    assert [b.batch_size for b in batches] == [64, 36, 64, 64, 64, 8]
    labels = np.concatenate([b.labels.numpy() for b in batches])
    assert np.array_equal(labels, table.column("label").to_numpy().astype(np.float32))


def test_the_progressive_window_holds_the_most_recent_rows():
    from cosparse.train.evaluate import log_loss, roc_auc
    from cosparse.train.progressive import ProgressiveWindow

    rng = np.random.default_rng(0)
    y = (rng.random(50) < 0.4).astype(np.float32)
    p = rng.random(50).astype(np.float32)
    w = ProgressiveWindow(17)
    assert w.scores() == {}
    for lo, hi in ((0, 8), (8, 30), (30, 31), (31, 50)):
        w.add(y[lo:hi], p[lo:hi])
        keep = slice(max(0, hi - 17), hi)
        got = w.scores()
        assert w.rows == got["eval_samples"] == hi - keep.start and w.scored == hi
        assert got["logloss"] == pytest.approx(log_loss(y[keep], p[keep]))
        if len(set(y[keep].tolist())) == 2:
            assert got["auc"] == pytest.approx(roc_auc(y[keep], p[keep]))


# --- the trainer ----------------------------------------------------------------------------------
def _eval_records(path: Path) -> list[dict]:
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in recs if r["kind"] == "eval"]


@pytest.mark.parametrize("reader, write", [("csv", write_csv), ("parquet", write_parquet)])
def test_files_arriving_during_a_run_are_trained(tmp_path, reader, write):
    """Two files arrive after the run started, after a gap longer than the stall timeout (an
    idle stream beats: no stall), each trained; progressive-validation records are written,
    checkpoints are taken by time, and the run ends on the idle timeout."""
    watch = tmp_path / "in"
    watch.mkdir()
    write(watch, f"a.{reader}", 0, 20)
    raw = _raw(watch, reader, idle_timeout_s=2.5)
    raw["data"]["workers"] = 1
    raw["train"].update(metrics_json=str(tmp_path / "m.jsonl"), stall_timeout_s=1.0,
                        checkpoint={"dir": str(tmp_path / "ck"), "every_s": 0.5, "keep": 50})
    t = Trainer(config_from_mapping(raw), log=print)
    try:
        def arrive() -> None:  # b once a is trained; c 1.2 s after b is (the trainer idle)
            for step, name, start, n in ((3, "b", 20, 13), (5, "c", 33, 9)):
                t0 = time.monotonic()
                while t.state.step < step and time.monotonic() - t0 < 20:
                    time.sleep(0.02)
                time.sleep(1.2 if name == "c" else 0.1)
                write(watch, f"{name}.{reader}", start, n)

        writer = _later(0.0, arrive)
        out = t.run()
        writer.join()
    finally:
        t.close()
    assert t.progressive.scored == 42  # every row of the three files, once
    assert out["step"] == 3 + 2 + 2 and t.state.stream["file"] == f"c.{reader}"
    assert t.state.stream["rows"] == 9
    evals = _eval_records(tmp_path / "m.jsonl")
    assert evals and all(r["progressive"] for r in evals)
    assert evals[-1]["eval_samples"] == 42 and evals[-1]["step"] == 7
    assert 0.0 < evals[-1]["logloss"] < 5.0
    saved = [p.name for p in checkpoints(tmp_path / "ck")]
    # by time: c's first step came 1.2 s after the step before it, so it saved (every_s 0.5)
    assert "step_00000006" in saved and len(saved) < 7, saved
    assert _where(read_meta(tmp_path / "ck" / "step_00000006")["stream"]) == {
        "file": f"c.{reader}", "mtime_ns": os.stat(watch / f"c.{reader}").st_mtime_ns,
        "rows": 8, "batches": 1}


def test_a_stopped_stream_resumes_after_the_last_file_and_row_it_trained(tmp_path):
    """Run 1 stops mid-file and checkpoints; files arrive while it is down; run 2 resumes and
    trains the rest of that file and the new ones: every row exactly once (counted)."""
    watch = tmp_path / "in"
    watch.mkdir()
    write_csv(watch, "a.csv", 0, 20)  # 3 batches
    write_csv(watch, "b.csv", 20, 21)  # 3 batches
    os.utime(watch / "a.csv", (time.time() - 10,) * 2)  # (a before b)
    raw = _raw(watch, idle_timeout_s=1.0)
    raw["train"].update(steps=4, checkpoint={"dir": str(tmp_path / "ck")})
    t = Trainer(config_from_mapping(raw), log=print)
    try:
        t.run(evaluate=False)
        first = t.progressive.scored
        t.save()
        assert _where(t.state.stream) == {"file": "b.csv", "mtime_ns": os.stat(watch / "b.csv").st_mtime_ns,
                                  "rows": 8, "batches": 1}
    finally:
        t.close()
    assert first == 20 + 8
    write_csv(watch, "c.csv", 41, 6)  # arrived while the run was down
    raw2 = copy.deepcopy(raw)
    raw2["train"]["steps"] = 100
    t2 = Trainer(config_from_mapping(raw2), log=print)
    try:
        t2.resume(str(tmp_path / "ck"))
        _later(0.3, write_csv, watch, "d.csv", 47, 3)
        out = t2.run()
    finally:
        t2.close()
    # the rest of b (13 rows), c (6), d (3): none of a again, none of b's first batch
    assert t2.progressive.scored == 13 + 6 + 3
    assert first + t2.progressive.scored == 50
    assert out["step"] == 4 + 2 + 1 + 1 and t2.state.stream["file"] == "d.csv"


def test_a_stream_trains_on_tiered_tables(tmp_path):
    """The tiers are sized from the first batches: those of the files there at start-up."""
    write_csv(tmp_path, "a.csv", 0, 12)
    raw = _raw(tmp_path, idle_timeout_s=0.6)
    raw["store"] = {"device": {"rows": 64, "policy": "lru"}}
    t = Trainer(config_from_mapping(raw), log=print)
    try:
        _later(0.2, write_csv, tmp_path, "b.csv", 12, 10)
        out = t.run()
    finally:
        t.close()
    assert t.sizing is not None and t.progressive.scored == 22 and out["step"] == 4


# --- config -------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, message", [
    (lambda r: r["data"].update(reader="criteo_tsv", columns=None),
     "data.stream: streams the files of reader csv or parquet, not 'criteo_tsv'"),
    (lambda r: r["data"]["stream"].update(watch=""), "data.stream.watch: name the directory"),
    (lambda r: r["data"].update(path="/x.csv"), "data.stream: the files come from "
     "data.stream.watch; drop data.path"),
    (lambda r: r["data"]["stream"].update(pattern="sub/*.csv"), "data.stream.pattern: a glob on "
     "file names"),
    (lambda r: r["data"]["stream"].update(poll_s=0), "data.stream.poll_s"),
    (lambda r: r["data"]["stream"].update(poll_s=600), "data.stream.poll_s"),
    (lambda r: r["data"]["stream"].update(idle_timeout_s=-1), "data.stream.idle_timeout_s"),
    (lambda r: r["data"]["stream"].update(eval_window_rows=0), "data.stream.eval_window_rows"),
    (lambda r: r["data"].update(split={"by": "hash", "key": "u"}), "data.split: a stream "
     "evaluates by progressive validation"),
    (lambda r: r["features"].update(spec="s.yaml", consumer="c"), "data.stream: streams train "
     "one model"),
    (lambda r: r["train"]["checkpoint"].update(every_s=60), "train.checkpoint.dir: needed when "
     "train.checkpoint.every_s is set"),
    (lambda r: r["train"]["checkpoint"].update(every_s=-1, dir="ck"), "train.checkpoint.every_s"),
])
def test_bad_stream_config_is_refused_naming_the_key(tmp_path, change, message):
    raw = _raw(tmp_path)
    raw.setdefault("features", {})
    raw["train"]["checkpoint"] = {}
    change(raw)
    with pytest.raises(ConfigError, match=None) as e:
        config_from_mapping(raw)
    assert message in str(e.value)


def test_a_missing_watch_directory_or_no_first_file_is_a_clear_error(tmp_path):
    from cosparse.data.errors import DataError

    with pytest.raises(DataError, match="data.stream.watch: .* is not a directory"):
        model_inputs(config_from_mapping(_raw(tmp_path / "nope")))
    with pytest.raises(DataError, match=r"no complete file matching '\*.csv' arrived in .* "
                                        r"within 0.5 s"):
        model_inputs(config_from_mapping(_raw(tmp_path, idle_timeout_s=0.5)))
    # the files of one stream share their columns
    write_csv(tmp_path, "a.csv", 0, 4)
    (tmp_path / "b.csv").write_text("label,v,x\n1,a,3\n")
    os.utime(tmp_path / "b.csv", (time.time() + 5,) * 2)
    inputs = model_inputs(config_from_mapping(_raw(tmp_path, idle_timeout_s=0.5)))
    with pytest.raises(DataError, match=r"b.csv: its columns give the features v .* first "
                                        r"file a.csv gave u"):
        list(BatchStream(inputs.train))
    assert StreamConfig().pattern == "*.parquet"


def test_cosparse_train_streams_and_resumes_from_the_command_line(tmp_path):
    """``cosparse train`` on a YAML config with data.stream, stopped at --steps and resumed
    with --resume: the second run trains the rest, every row once."""
    import subprocess
    import sys

    import yaml

    watch = tmp_path / "in"
    watch.mkdir()
    write_csv(watch, "a.csv", 0, 20)
    os.utime(watch / "a.csv", (time.time() - 10,) * 2)
    write_csv(watch, "b.csv", 20, 21)
    raw = _raw(watch, idle_timeout_s=1.0)
    raw["train"].update(metrics_json=str(tmp_path / "m.jsonl"),
                        checkpoint={"dir": str(tmp_path / "ck"), "every": 2})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))

    def train(*args: str) -> dict:
        r = subprocess.run([sys.executable, "-m", "cosparse", "train", "--config",
                            str(tmp_path / "c.yaml"), "--no-progress", *args], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout.strip().splitlines()[-1])["final"]

    assert train("--steps", "4")["step"] == 4
    write_csv(watch, "c.csv", 41, 6)
    final = train("--resume", str(tmp_path / "ck"))
    assert final["step"] == 4 + 2 + 1 and final["eval_samples"] == 13 + 6
    assert read_meta(tmp_path / "ck")["stream"]["file"] == "b.csv"  # (every 2: step 6)
