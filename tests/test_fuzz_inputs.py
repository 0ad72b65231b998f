"""Fuzzing the inputs a user hands the engine: the Criteo TSV, Parquet and event-log readers, and
the YAML config loader (issue 11, "the suites that keep it fixed").

Property: on arbitrary or mutated input each either gives well-formed output or raises the
project's own error (``DataError`` naming the file, and the line where a line is bad;
``ConfigError`` naming the key or the file) -- never another exception type, never a hang.
A last test builds and trains every config whose numbers the loader accepts, so a value that
passes validation cannot crash the run.

Bounded: hypothesis with a fixed number of derandomized examples (no example database), each
test well under 60 s on two cores. ``COSPARSE_FUZZ_SCALE=10`` runs ten times the examples. Each
test prints how many cases it ran.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gzip
import io
import math
import os
import re
import resource
import string
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cosparse.batch import SparseBatch
from cosparse.config import ConfigError, EventsConfig, config_from_mapping, load_config
from cosparse.data import CriteoTSVReader, DataError, ParquetReader
from cosparse.data.columns import CRITEO_KEYS
from cosparse.data.events import SEQUENCE_KEYS, TaobaoEventsReader
from cosparse.data.parquet import COLUMNS
from cosparse.train.nonfinite import NonFiniteLoss

SCALE = float(os.environ.get("COSPARSE_FUZZ_SCALE", "1"))


BUDGET_S = 40.0 * SCALE  # past this, the remaining examples are drawn but not run


def _settings(examples: int) -> settings:
    return settings(max_examples=max(1, int(examples * SCALE)), deadline=None, database=None,
                    derandomize=True, suppress_health_check=list(HealthCheck))


class Cases:
    """Counts the examples run, and stops running them once the time budget is spent (so a
    loaded machine shortens the test instead of stretching it). Once an example has failed the
    budget no longer applies, so hypothesis can replay and shrink it."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.run = 0
        self.failed = False

    def counted(self, body: Callable[..., None]) -> Callable[..., None]:
        """``body`` as a hypothesis test that counts its runs and honours the budget."""
        @functools.wraps(body)
        def example(*args: Any, **kwargs: Any) -> None:
            if not self.failed and time.perf_counter() - self.t0 > BUDGET_S:
                return
            self.run += 1
            try:
                body(*args, **kwargs)
            except BaseException:
                self.failed = True
                raise

        return example

    def report(self, capsys: pytest.CaptureFixture[str], name: str) -> None:
        with capsys.disabled():
            print(f"\n[fuzz] {name}: {self.run} cases in {time.perf_counter() - self.t0:.1f} s")


def _check_data_error(e: DataError, path: str, total_lines: int | None = None) -> None:
    """A DataError names the file first, and a line of the file where it names one."""
    msg = str(e)
    assert msg.startswith(path), msg
    m = re.match(re.escape(path) + r":(\d+):", msg)
    if m is not None and total_lines is not None:
        assert 1 <= int(m.group(1)) <= total_lines, msg


def _read_split(reader) -> list[SparseBatch]:
    return [reader.build(t) for t in reader.tasks()]


# --- Criteo TSV ---------------------------------------------------------------------------------
_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\n"), max_size=12)
_DIGITS = st.text(alphabet=string.digits, min_size=1, max_size=18)
_HEX = st.text(alphabet="0123456789abcdefABCDEF", min_size=1, max_size=8)


def _valid_criteo_fields(rng: np.random.Generator) -> list[str]:
    """The 40 fields of a well-formed line (the bulk of a file: drawn by numpy, fast)."""
    def digits() -> str:
        d = "".join(map(str, rng.integers(0, 10, rng.integers(1, 19))))
        return "-" + d if rng.random() < 0.2 else d

    def hexs() -> str:
        return "".join(rng.choice(list("0123456789abcdefABCDEF"), rng.integers(1, 9)))

    ints = ["" if rng.random() < 0.2 else digits() for _ in range(13)]
    cats = ["" if rng.random() < 0.2 else hexs() for _ in range(26)]
    return [str(rng.integers(0, 2)), *ints, *cats]


@st.composite
def _mutation(draw) -> tuple[int, str, int, str]:
    """(line, kind, field, text) of one change to a well-formed line."""
    kind = draw(st.sampled_from(["field", "drop", "add", "bytes", "long"]))
    text = {"field": _TEXT, "add": _TEXT,
            "long": st.sampled_from(["9", "f", "-"]).map(lambda c: c * 19),
            "bytes": st.binary(max_size=8).map(lambda b: b.decode("latin-1").replace("\n", "")),
            "drop": st.just("")}[kind]
    return draw(st.integers(0, 99)), kind, draw(st.integers(0, 40)), draw(text)


@st.composite
def _criteo_file(draw) -> tuple[bytes, bool, int]:
    """(file bytes, every line valid by construction, line count)."""
    n = draw(st.integers(0, 16))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lines = [_valid_criteo_fields(rng) for _ in range(n)]
    valid = True
    for line, kind, i, text in draw(st.lists(_mutation(), max_size=4)) if n else []:
        fields = lines[line % n]
        i %= len(fields)
        valid = False
        if kind == "drop" and len(fields) > 1:
            fields.pop(i)
        elif kind == "add":
            fields.insert(i, text)
        else:
            fields[i] = text
    eol = draw(st.sampled_from(["\n", "\r\n"]))
    text = eol.join("\t".join(f) for f in lines) + (eol if n and draw(st.booleans()) else "")
    data = text.encode("utf-8", "surrogatepass")
    if n and draw(st.integers(0, 3)) == 0:
        data = draw(st.sampled_from([b"\n", b"\t\t\n", b"\x00\xff\n"])) + data
        valid = False
    if draw(st.integers(0, 4)) == 0:  # gzip, possibly cut short
        z = gzip.compress(data)
        cut = draw(st.integers(0, len(z)))
        valid = valid and cut == len(z)
        data = z[:cut] if cut < len(z) else z
    return data, valid, n


def _check_criteo_batch(b: SparseBatch, num_lines: int, skip: bool) -> None:
    n = b.batch_size
    assert b.keys == CRITEO_KEYS and b.dense.shape == (n, 13) and b.labels.shape == (n,)
    assert b.lengths.shape == (26 * n,) and int(b.lengths.sum()) == b.values.numel()
    assert bool(((b.lengths == 0) | (b.lengths == 1)).all()) and bool((b.values >= 0).all())
    assert bool(torch.isfinite(b.dense).all()) and bool((b.dense >= 0).all())
    assert bool(((b.labels == 0) | (b.labels == 1)).all())
    assert n + b.bad_records == num_lines and (skip or b.bad_records == 0)


def test_fuzz_criteo_tsv_reader(capsys: pytest.CaptureFixture[str]) -> None:
    cases = Cases()

    @_settings(800)
    @given(f=_criteo_file(), batch=st.integers(1, 7), eval_fraction=st.sampled_from([0.0, 0.3]),
           skip=st.booleans())
    @cases.counted
    def run(f: tuple[bytes, bool, int], batch: int, eval_fraction: float, skip: bool) -> None:
        data, valid, n_lines = f
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "data.txt.gz" if data[:2] == b"\x1f\x8b" else "data.txt")
            Path(path).write_bytes(data)
            for split in ("train", "eval"):
                try:
                    r = CriteoTSVReader(path, batch, split, eval_fraction,
                                        "skip" if skip else "fail")
                    tasks = list(r.tasks())
                    got = [r.build(t) for t in tasks]
                except DataError as e:
                    _check_data_error(e, path, n_lines + 1)
                    empty = "has no lines" in str(e) or "training split is empty" in str(e)
                    assert not valid or empty, f"a valid file was refused: {e}"
                    continue
                assert len(got) == r.num_batches
                assert got or split == "eval", "an empty training split must be an error"
                for t, b in zip(tasks, got, strict=True):
                    _check_criteo_batch(b, t.num_lines, skip)

    run()
    cases.report(capsys, "criteo_tsv")


# --- Parquet ------------------------------------------------------------------------------------
_FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(
    [0.0, 1.0, 2.5, -3.0, 1e18, 1e19, math.nan, math.inf, -math.inf]))
_INTS = st.integers(-(2**63), 2**63 - 1)


def _column(draw, name: str, n: int) -> pa.Array:
    """A column of a random Arrow type, with random (often bad) values."""
    kind = draw(st.sampled_from(["int64", "int32", "uint64", "float", "string", "large_string",
                                 "bool", "null", "binary", "dict", "list"]))
    nulls = st.none() if draw(st.booleans()) else st.nothing()
    if kind in ("int64", "int32", "uint64"):
        lo, hi = {"int64": (-(2**63), 2**63 - 1), "int32": (-(2**31), 2**31 - 1),
                  "uint64": (0, 2**64 - 1)}[kind]
        vals = st.one_of(st.integers(lo, hi), st.integers(-2, 2).filter(lambda x: lo <= x <= hi))
        return pa.array(draw(st.lists(st.one_of(vals, nulls), min_size=n, max_size=n)),
                        getattr(pa, kind)())
    if kind == "float":
        return pa.array(draw(st.lists(st.one_of(_FLOATS, nulls), min_size=n, max_size=n)),
                        pa.float64())
    if kind in ("string", "large_string", "dict"):
        s = st.one_of(_TEXT, _HEX, _DIGITS, st.just(""))
        arr = pa.array(draw(st.lists(st.one_of(s, nulls), min_size=n, max_size=n)),
                       pa.large_string() if kind == "large_string" else pa.string())
        return arr.dictionary_encode() if kind == "dict" else arr
    if kind == "bool":
        return pa.array(draw(st.lists(st.one_of(st.booleans(), nulls), min_size=n, max_size=n)))
    if kind == "binary":
        return pa.array(draw(st.lists(st.binary(max_size=6), min_size=n, max_size=n)), pa.binary())
    if kind == "list":
        return pa.array(draw(st.lists(st.lists(st.integers(0, 9), max_size=2), min_size=n,
                                      max_size=n)), pa.list_(pa.int64()))
    return pa.nulls(n)


@st.composite
def _parquet_file(draw) -> tuple[bytes, bool]:
    """(Parquet bytes or a corruption of them, well-formed by construction)."""
    n = draw(st.integers(0, 12))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    bad_cols = set(draw(st.lists(st.sampled_from(COLUMNS), max_size=3, unique=True)))
    cols = {name: _column(draw, name, n) if name in bad_cols else _good_column(rng, name, n)
            for name in COLUMNS}
    if draw(st.integers(0, 5)) == 0:  # a missing column
        cols.pop(draw(st.sampled_from(COLUMNS)))
        bad_cols.add("missing")
    buf = io.BytesIO()
    pq.write_table(pa.table(cols), buf, row_group_size=draw(st.integers(1, 8)))
    data = buf.getvalue()
    if draw(st.integers(0, 3)) == 0:  # corrupt or cut the file itself
        bad_cols.add("bytes")
        arr = bytearray(data)
        for _ in range(draw(st.integers(1, 8))):
            if arr:
                arr[draw(st.integers(0, len(arr) - 1))] = draw(st.integers(0, 255))
        data = bytes(arr[: draw(st.integers(0, len(arr)))]) if draw(st.booleans()) else bytes(arr)
    return data, not bad_cols


def _good_column(rng: np.random.Generator, name: str, n: int) -> pa.Array:
    """A well-formed column (drawn by numpy, fast)."""
    missing = rng.random(n) < 0.2
    if name == "label":
        return pa.array(rng.integers(0, 2, n), pa.int8())
    if name.startswith("I"):
        return pa.array(rng.integers(-5, 10**6, n), pa.int64(), mask=missing)
    return pa.array(["" if m else format(int(v), "x") for m, v in
                     zip(missing, rng.integers(0, 2**32, n), strict=True)], pa.string())


def test_fuzz_parquet_reader(capsys: pytest.CaptureFixture[str]) -> None:
    cases = Cases()

    @_settings(800)
    @given(f=_parquet_file(), batch=st.integers(1, 5), skip=st.booleans())
    @cases.counted
    def run(f: tuple[bytes, bool], batch: int, skip: bool) -> None:
        data, valid = f
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "data.parquet")
            Path(path).write_bytes(data)
            try:
                r = ParquetReader(path, batch, "train", 0.0, "skip" if skip else "fail")
                tasks = list(r.tasks())
                got = [r.build(t) for t in tasks]
            except DataError as e:
                _check_data_error(e, path)
                assert not valid or "has no rows" in str(e), f"a valid file was refused: {e}"
                return
            assert got, "an empty training split must be an error"
            for t, b in zip(tasks, got, strict=True):
                _check_criteo_batch(b, t.num_rows, skip)

    run()
    cases.report(capsys, "parquet")


# --- Taobao event log ---------------------------------------------------------------------------
@st.composite
def _event_line(draw) -> tuple[str, bool]:
    fields = [str(draw(st.integers(0, 6))), str(draw(st.integers(0, 50))),
              str(draw(st.integers(0, 9))), draw(st.sampled_from(["pv", "cart", "fav", "buy"])),
              str(draw(st.integers(0, 10**10)))]
    valid = True
    for _ in range(draw(st.integers(0, 2))):
        valid = False
        i = draw(st.integers(0, len(fields) - 1))
        kind = draw(st.sampled_from(["field", "drop", "add", "long", "neg"]))
        if kind == "field":
            fields[i] = draw(_TEXT).replace(",", ";")
        elif kind == "drop" and len(fields) > 1:
            fields.pop(i)
        elif kind == "add":
            fields.insert(i, draw(_TEXT).replace(",", ";"))
        elif kind == "long":
            fields[i] = "9" * draw(st.integers(18, 30))
        else:
            fields[i] = "-" + fields[i]
    return ",".join(fields), valid


@st.composite
def _event_file(draw) -> tuple[bytes, bool, int]:
    lines = draw(st.lists(_event_line(), max_size=30))
    eol = draw(st.sampled_from(["\n", "\r\n"]))
    data = (eol.join(x for x, _ in lines) + (eol if lines and draw(st.booleans()) else "")
            ).encode("utf-8", "surrogatepass")
    valid = all(ok for _, ok in lines)
    if draw(st.integers(0, 6)) == 0:
        data += draw(st.binary(max_size=20))
        valid = False
    return data, valid, len(lines)


def test_fuzz_event_log_reader(capsys: pytest.CaptureFixture[str]) -> None:
    cases = Cases()

    @_settings(1000)
    @given(f=_event_file(), batch=st.integers(1, 6), skip=st.booleans(),
           eval_fraction=st.sampled_from([0.0, 0.25]), max_len=st.integers(1, 4),
           min_history=st.integers(0, 2),
           positive=st.lists(st.sampled_from(["pv", "cart", "fav", "buy"]), min_size=1,
                             max_size=2, unique=True))
    @cases.counted
    def run(f, batch, skip, eval_fraction, max_len, min_history, positive) -> None:
        data, valid, n_lines = f
        ev = EventsConfig(max_len=max_len, min_history=min_history, positive=positive, seed=1)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "events.csv")
            Path(path).write_bytes(data)
            for split in ("train", "eval"):
                try:
                    r = TaobaoEventsReader(path, batch, split, eval_fraction,
                                           "skip" if skip else "fail", ev)
                    got = _read_split(r)
                except DataError as e:
                    _check_data_error(e, path, n_lines + 2)
                    refused = not any(s in str(e) for s in ("has no events", "training split is "
                                                            "empty", "no training samples"))
                    assert not (valid and refused), f"a valid file was refused: {e}"
                    continue
                assert sum(b.batch_size for b in got) == r.num_samples
                assert got or split == "eval", "an empty training split must be an error"
                for b in got:
                    n = b.batch_size
                    assert b.keys == SEQUENCE_KEYS and b.dense.shape == (n, 0)
                    lens = b.lengths.view(6, n)
                    assert bool((lens[:3] == 1).all()) and bool((lens[3:] <= max_len).all())
                    assert bool((lens[3] == lens[4]).all() and (lens[3] == lens[5]).all())
                    assert int(b.lengths.sum()) == b.values.numel()
                    assert bool(((b.labels == 0) | (b.labels == 1)).all())

    run()
    cases.report(capsys, "taobao_events")


# --- YAML config loader -------------------------------------------------------------------------
VALID = {
    "data": {"reader": "synthetic", "batch_size": 32,
             "synthetic": {"num_features": 4, "vocab_size": 500, "num_batches": 8,
                           "eval_batches": 1}},
    "model": {"kind": "dlrm", "bottom": [8, 4], "top": [8, 1],
              "dense_optimizer": {"kind": "adagrad", "lr": 0.05}},
    "tables": [{"name": "t", "dim": 4, "features": ["C1", "C2", "C3", "C4"],
                "optimizer": {"kind": "rowwise_adagrad", "lr": 0.05},
                "init": {"kind": "uniform", "low": -0.05, "high": 0.05}}],
    "store": {"decay": 0.99},
    "supply": {"lookahead": 1},
    "train": {"steps": 2, "log_every": 1, "progress": False},
}

_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True), _TEXT,
    st.sampled_from(["2GiB", "1.2.3MB", "nan", ".inf", "arch-b", "ps-direct", "-1", "1e999"]),
)
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(_TEXT, inner, max_size=3)), max_leaves=6)


def _paths(node, prefix=()):
    """Every (path) into a nested mapping/list, leaves and inner nodes."""
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


@st.composite
def _mutated_config(draw) -> dict:
    raw = copy.deepcopy(VALID)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(raw) if p]
        path = draw(st.sampled_from(paths))
        node = raw
        for k in path[:-1]:
            node = node[k]
        kind = draw(st.sampled_from(["set", "set", "delete", "add"]))
        if kind == "delete" and isinstance(node, dict):
            del node[path[-1]]
        elif kind == "add" and isinstance(node, dict):
            node[draw(st.sampled_from(["steps", "lr", "rows", "extra", "preset", "path"]))] = \
                draw(_VALUES)
        else:
            node[path[-1]] = draw(_VALUES)
    if draw(st.integers(0, 3)) == 0:
        raw["preset"] = draw(st.one_of(st.sampled_from(["arch-a", "arch-b", "resident"]), _VALUES))
    return raw


@st.composite
def _yaml_text(draw) -> bytes:
    kind = draw(st.sampled_from(["mutated", "bytes", "text", "cut"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "text":
        return draw(st.text(alphabet=":-[]{},&*!|>'\"#%@ \n\tabcd0129.", max_size=120)).encode()
    text = yaml.safe_dump(draw(_mutated_config()), allow_unicode=True)
    if kind == "cut":
        text = text[: draw(st.integers(0, len(text)))]
    return text.encode("utf-8", "surrogatepass")


_OVERRIDES = st.dictionaries(
    st.sampled_from(["train.steps", "data.path", "train.metrics_json", "train.progress",
                     "store.device.rows", "model.bottom", "x.y.z"]), _VALUES, max_size=2)


def test_fuzz_yaml_config_loader(capsys: pytest.CaptureFixture[str]) -> None:
    cases = Cases()

    @_settings(1500)
    @given(text=_yaml_text(), overrides=_OVERRIDES)
    @cases.counted
    def run(text: bytes, overrides: dict) -> None:
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "c.yaml"
            p.write_bytes(text)
            try:
                load_config(p, overrides)
            except ConfigError as e:
                assert str(e), "a ConfigError must say what is wrong"

    run()
    cases.report(capsys, "yaml_config")


# --- accepted numbers train ----------------------------------------------------------------------
# The numeric keys a user may get wrong, each with values around its edges. Whatever the loader
# accepts must build the trainer and train (no process-starting keys: PS shards, data workers).
_NUMERIC_KEYS = [
    ("data", "batch_size"), ("data", "eval_fraction"), ("data", "synthetic", "num_features"),
    ("data", "synthetic", "num_dense"), ("data", "synthetic", "vocab_size"),
    ("data", "synthetic", "alpha"), ("data", "synthetic", "bag_min"),
    ("data", "synthetic", "bag_max"), ("data", "synthetic", "eval_batches"),
    ("data", "synthetic", "seed"), ("model", "bottom", 0), ("model", "top", 0),
    ("model", "dense_optimizer", "lr"), ("tables", 0, "dim"), ("tables", 0, "optimizer", "lr"),
    ("tables", 0, "optimizer", "eps"), ("tables", 0, "optimizer", "initial_accumulator"),
    ("tables", 0, "optimizer", "beta1"), ("tables", 0, "init", "low"),
    ("tables", 0, "init", "high"), ("tables", 0, "init", "std"), ("tables", 0, "seed"),
    ("tables", 0, "hash_size"), ("tables", 0, "num_embeddings"), ("store", "decay"),
    ("store", "probe_batches"), ("supply", "lookahead"), ("supply", "horizon"),
    ("train", "steps"), ("train", "epochs"), ("train", "threads"), ("train", "log_every"),
    ("train", "eval_every"), ("train", "seed"), ("store", "device", "rows"),
]
_EDGES = st.one_of(st.sampled_from([1, 2, 3, 0.5, 1.0, 1e-12, 1e12]),  # often in range
                   st.sampled_from([-1, 0, -0.5, math.nan, math.inf, 1e300, 1e-300, 2**62]))


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")  # num_dense: 0
def test_fuzz_accepted_numbers_build_and_train(capsys: pytest.CaptureFixture[str]) -> None:
    from cosparse.train.trainer import Trainer

    cases = Cases()
    accepted = trained = 0

    @_settings(120)
    @given(changes=st.lists(st.tuples(st.sampled_from(_NUMERIC_KEYS), _EDGES), min_size=1,
                            max_size=2),
           kind=st.sampled_from(["rowwise_adagrad", "adam", "sgd"]))
    @cases.counted
    def run(changes: list, kind: str) -> None:
        nonlocal accepted, trained
        raw = copy.deepcopy(VALID)
        raw["tables"][0]["optimizer"]["kind"] = kind
        for path, value in changes:
            node = raw
            for k in path[:-1]:
                node = node[k] if isinstance(node, list) else node.setdefault(k, {})
            if isinstance(value, float) and value.is_integer() and abs(value) < 1e6 \
                    and path[-1] not in ("lr", "eps", "alpha", "decay", "eval_fraction", "low",
                                         "high", "std", "beta1", "initial_accumulator"):
                value = int(value)
            node[path[-1]] = value
        try:
            cfg = config_from_mapping(raw)
        except ConfigError:
            return
        if (cfg.data.batch_size > 64 or cfg.data.synthetic.vocab_size > 10**6
                or cfg.tables[0].dim > 64 or cfg.model.bottom[0] > 64 or cfg.model.top[0] > 64
                or cfg.data.synthetic.eval_batches > 8 or (cfg.tables[0].num_embeddings or 0) > 10**6
                or cfg.train.eval_every == 1):
            return  # accepted, but too big or slow to train here (memory and time are the limit)
        cfg.train.steps = min(cfg.train.steps, 3)
        accepted += 1
        t = None
        try:
            t = Trainer(cfg, log=lambda m: None)
            t.run()
            trained += 1
        except (ConfigError, DataError, NonFiniteLoss):
            pass
        finally:
            if t is not None:
                t.close()
            torch.set_num_threads(n_threads)  # train.threads sets it for the process

    n_threads = torch.get_num_threads()
    with _memory_cap(6 << 30):  # a value that allocates without bound fails here, not the host
        run()
    cases.report(capsys, f"accepted configs train ({accepted} accepted, {trained} trained "
                         "to the end)")
    assert trained > 0


@contextlib.contextmanager
def _memory_cap(extra_bytes: int) -> Iterator[None]:
    """Cap this process's address space at its current size plus ``extra_bytes`` (Linux), so
    that a config that allocates too much raises MemoryError instead of waking the OOM killer."""
    try:
        with open("/proc/self/status") as f:
            vm = next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmSize:"))
    except (OSError, StopIteration):
        yield
        return
    old = resource.getrlimit(resource.RLIMIT_AS)
    cap = vm + extra_bytes
    if old[1] != resource.RLIM_INFINITY:
        cap = min(cap, old[1])
    resource.setrlimit(resource.RLIMIT_AS, (cap, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, old)
