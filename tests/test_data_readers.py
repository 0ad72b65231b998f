"""Readers: Criteo TSV parsing and bad input, Parquet roundtrip, synthetic Zipf data."""

from __future__ import annotations

import gzip
import math
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from cosparse.batch import SparseBatch
from cosparse.config import DataConfig, SyntheticConfig
from cosparse.data import (
    CriteoTSVReader,
    DataError,
    ParquetReader,
    SyntheticReader,
    make_reader,
    write_criteo_parquet,
)
from cosparse.data import kernels as K
from cosparse.data.lines import count_lines, line_chunks
from cosparse.data.parquet import read_criteo_tsv_table

CRITEO = Path(__file__).resolve().parents[2] / "shared/data/criteo/train_head10k.txt"


@pytest.fixture
def criteo() -> Path:
    if not CRITEO.is_file():
        pytest.skip(f"{CRITEO} not present")
    return CRITEO


def read_all(reader) -> list[SparseBatch]:
    return [reader.build(t) for t in reader.tasks()]


def assert_same(a: SparseBatch, b: SparseBatch) -> None:
    assert a.keys == b.keys and a.index == b.index and a.bad_records == b.bad_records
    for f in ("values", "lengths", "dense", "labels"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f


def real_lines(path: Path, n: int) -> list[str]:
    with open(path) as f:
        return [next(f).rstrip("\n") for _ in range(n)]


# --- Criteo TSV ------------------------------------------------------------------------------
def test_criteo_split_counts(criteo: Path) -> None:
    tr = CriteoTSVReader(criteo, 1024, "train", 0.2)
    ev = CriteoTSVReader(criteo, 1024, "eval", 0.2)
    assert tr.line_range() == (1, 8000) and ev.line_range() == (8001, 2000)
    tb, eb = read_all(tr), read_all(ev)
    assert [b.batch_size for b in tb] == [1024] * 7 + [832]
    assert [b.batch_size for b in eb] == [1024, 976]
    assert [b.index for b in tb] == list(range(8)) and tr.num_batches == 8
    assert [b.index for b in eb] == [0, 1] and ev.num_batches == 2
    for b in tb + eb:
        assert b.keys == [f"C{i}" for i in range(1, 27)]
        assert b.dense.shape == (b.batch_size, 13) and b.dense.dtype == torch.float32
        assert int(b.lengths.sum()) == b.values.numel()
        assert int(b.lengths.max()) <= 1 and b.bad_records == 0
        assert int(b.values.min()) >= 0 and int(b.values.max()) < 2**32
    assert sum(int(b.labels.sum()) for b in tb + eb) == 2182  # README: 2182 positives of 10000


def test_criteo_first_lines_values(criteo: Path) -> None:
    b = read_all(CriteoTSVReader(criteo, 8, "train", 0.0))[0]
    ints = [1, 1, 5, 0, 1382, 4, 15, 2, 181, 1, 2, None, 2]
    want = [0.0 if x is None else math.log1p(x) for x in ints]
    np.testing.assert_allclose(b.dense[0].numpy(), np.array(want, np.float32), rtol=0, atol=0)
    # line 5: I2 = -1 -> log1p(max(-1, 0)) = 0; I3 missing -> 0
    assert float(b.dense[4, 1]) == 0.0 and float(b.dense[4, 2]) == 0.0 and float(b.dense[4, 0]) > 0
    assert b.labels[:5].tolist() == [0.0] * 5
    ids, lengths = b.feature("C1")
    assert int(ids[0]) == 0x68FD1E64 and lengths.tolist() == [1] * 8
    ids, lengths = b.feature("C22")  # empty on line 1, "ad3062eb" on line 3
    assert int(lengths[0]) == 0 and int(lengths[2]) == 1
    offs = torch.cumsum(lengths, 0) - lengths
    assert int(ids[offs[2]]) == 0xAD3062EB
    for key in ("C19", "C20", "C25", "C26"):  # empty on line 3 (ends in two empty fields)
        assert int(b.feature(key)[1][2]) == 0


def test_criteo_kjt_and_array_roundtrip(criteo: Path) -> None:
    b = read_all(CriteoTSVReader(criteo, 256, "eval", 0.2))[1]
    kjt = b.to_kjt_layout()
    back = SparseBatch.from_kjt_layout(kjt["keys"], kjt["values"], kjt["lengths"], b.dense, b.labels)
    back.index = b.index
    assert_same(b, back)
    assert_same(b, SparseBatch.from_arrays(b.to_arrays()))
    for key in b.keys:
        ids, lengths = back.feature(key)
        assert torch.equal(ids, b.feature(key)[0]) and torch.equal(lengths, b.feature(key)[1])


def test_criteo_gzip_crlf_and_no_final_newline(criteo: Path, tmp_path: Path) -> None:
    lines = real_lines(criteo, 50)
    plain = tmp_path / "plain.txt"
    plain.write_text("\n".join(lines) + "\n")
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes(("\r\n".join(lines)).encode())  # CRLF, last line without newline
    gz = tmp_path / "data.txt.gz"
    gz.write_bytes(gzip.compress(("\n".join(lines)).encode()))
    ref = read_all(CriteoTSVReader(plain, 16, "train", 0.0))
    assert sum(b.batch_size for b in ref) == 50
    for p in (crlf, gz):
        got = read_all(CriteoTSVReader(p, 16, "train", 0.0))
        assert len(got) == len(ref)
        for a, b in zip(ref, got, strict=True):
            assert_same(a, b)


def test_criteo_resume_start_batch(criteo: Path) -> None:
    r = CriteoTSVReader(criteo, 700, "eval", 0.2)
    full = read_all(r)
    tail = [r.build(t) for t in r.tasks(start_batch=2)]
    assert [b.index for b in tail] == [2]
    assert_same(full[2], tail[0])
    assert list(r.tasks(start_batch=3)) == []


# --- bad input ---------------------------------------------------------------------------------
def corrupt(lines: list[str], line_no: int, col: int | None, value: str | None) -> list[str]:
    """Lines with field ``col`` of 1-based ``line_no`` set to ``value`` (None drops the last field)."""
    out = list(lines)
    fields = out[line_no - 1].split("\t")
    if col is None:
        fields = fields[:-1]
    else:
        fields[col] = value  # type: ignore[call-overload]
    out[line_no - 1] = "\t".join(fields)
    return out


def write(tmp_path: Path, lines: list[str], name: str = "bad.txt") -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


BAD_CASES = {
    "columns": (None, None, "wrong column count: expected 40 got 39"),
    "integer": (3, "abc", "non-numeric integer field I3 'abc'"),
    "integer_float": (5, "1.5", "non-numeric integer field I5 '1.5'"),
    "categorical": (14 + 7 - 1, "xyz", "non-hex categorical field C7 'xyz'"),
    "label": (0, "2", "bad label '2'"),
    "empty_label": (0, "", "bad label ''"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_criteo_bad_line_names_file_and_line(criteo: Path, tmp_path: Path, case: str) -> None:
    col, value, what = BAD_CASES[case]
    p = write(tmp_path, corrupt(real_lines(criteo, 20), 7, col, value))
    r = CriteoTSVReader(p, 5, "train", 0.0)
    tasks = list(r.tasks())
    r.build(tasks[0])  # lines 1..5 are fine
    with pytest.raises(DataError) as ei:
        r.build(tasks[1])
    assert str(ei.value).startswith(f"{p}:7: {what}")


def test_criteo_bad_line_number_in_eval_split(criteo: Path, tmp_path: Path) -> None:
    p = write(tmp_path, corrupt(real_lines(criteo, 20), 18, 14 + 2 - 1, "zz"))
    read_all(CriteoTSVReader(p, 3, "train", 0.2))  # lines 1..16 are fine
    with pytest.raises(DataError, match=re.escape(f"{p}:18: non-hex categorical field C2 'zz'")):
        read_all(CriteoTSVReader(p, 3, "eval", 0.2))


def test_criteo_skip_mode_drops_and_counts(criteo: Path, tmp_path: Path) -> None:
    lines = real_lines(criteo, 20)
    bad = corrupt(corrupt(corrupt(lines, 3, 0, "x"), 7, 3, "abc"), 12, None, None)
    p = write(tmp_path, bad)
    got = read_all(CriteoTSVReader(p, 5, "train", 0.0, on_bad_record="skip"))
    assert [b.bad_records for b in got] == [1, 1, 1, 0]
    assert [b.batch_size for b in got] == [4, 4, 4, 5]
    clean = read_all(CriteoTSVReader(write(tmp_path, lines, "clean.txt"), 20, "train", 0.0))[0]
    keep = [i for i in range(20) if i + 1 not in (3, 7, 12)]
    assert torch.equal(torch.cat([b.dense for b in got]), clean.dense[keep])
    assert torch.equal(torch.cat([b.labels for b in got]), clean.labels[keep])
    for key in ("C1", "C22"):
        ids, lengths = clean.feature(key)
        got_ids = torch.cat([b.feature(key)[0] for b in got])
        got_len = torch.cat([b.feature(key)[1] for b in got])
        assert torch.equal(got_len, lengths[keep])
        keep_mask = torch.repeat_interleave(
            torch.tensor([i in keep for i in range(20)]), lengths
        )
        assert torch.equal(got_ids, ids[keep_mask])
    with pytest.raises(DataError, match=re.escape(f"{p}:3: bad label 'x'")):
        read_all(CriteoTSVReader(p, 5, "train", 0.0, on_bad_record="fail"))


def test_criteo_blank_line_is_bad(criteo: Path, tmp_path: Path) -> None:
    lines = real_lines(criteo, 4)
    p = write(tmp_path, [*lines[:2], "", *lines[2:]])
    with pytest.raises(DataError, match=re.escape(f"{p}:3: wrong column count: expected 40 got 1")):
        read_all(CriteoTSVReader(p, 10, "train", 0.0))


def test_missing_file_names_path(tmp_path: Path) -> None:
    p = tmp_path / "nope.txt"
    with pytest.raises(DataError, match=re.escape(f"{p}: data file not found")):
        CriteoTSVReader(p, 10)
    with pytest.raises(DataError, match="nope.txt"):
        make_reader(DataConfig(reader="criteo_tsv", path=str(p)), "train")
    with pytest.raises(DataError, match="nope.parquet"):
        ParquetReader(tmp_path / "nope.parquet", 10)


def test_truncated_gzip_is_reported(criteo: Path, tmp_path: Path) -> None:
    data = gzip.compress(("\n".join(real_lines(criteo, 500)) + "\n").encode())
    p = tmp_path / "cut.txt.gz"
    p.write_bytes(data[: len(data) // 2])
    r = CriteoTSVReader(p, 100, "train", 0.0)
    with pytest.raises(DataError, match=re.escape(f"{p}: gzip file is truncated or corrupt")):
        read_all(r)


# --- Parquet -------------------------------------------------------------------------------------
@pytest.mark.parametrize("categorical", ["hex", "int64"])
def test_parquet_equals_tsv(criteo: Path, tmp_path: Path, categorical: str) -> None:
    p = write_criteo_parquet(
        criteo, tmp_path / "c.parquet", categorical=categorical, row_group_size=3000
    )
    for split in ("train", "eval"):
        a = read_all(CriteoTSVReader(criteo, 1024, split, 0.2))
        b = read_all(ParquetReader(p, 1024, split, 0.2))
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    r = make_reader(DataConfig(reader="parquet", path=str(p), batch_size=1000), "eval")
    assert [x.batch_size for x in read_all(r)] == [1000, 1000]


def test_parquet_rows_and_bad_value(criteo: Path, tmp_path: Path) -> None:
    t = read_criteo_tsv_table(criteo, rows=20)
    assert t.num_rows == 20
    c7 = t.column("C7").to_pylist()
    c7[6] = "xyz"
    t = t.set_column(t.schema.get_field_index("C7"), "C7", pa.array(c7, pa.string()))
    p = tmp_path / "bad.parquet"
    pq.write_table(t, p)
    with pytest.raises(DataError, match=re.escape(f"{p}: row 6 (0-based): non-hex categorical field C7")):
        read_all(ParquetReader(p, 5, "train", 0.0))
    got = read_all(ParquetReader(p, 5, "train", 0.0, on_bad_record="skip"))
    assert [b.bad_records for b in got] == [0, 1, 0, 0]
    assert sum(b.batch_size for b in got) == 19


# --- synthetic -----------------------------------------------------------------------------------
def syn(**kw: object) -> SyntheticConfig:
    base = {"num_features": 4, "num_dense": 3, "vocab_size": 10_000, "num_batches": 6,
            "eval_batches": 2}
    base.update(kw)
    return SyntheticConfig(**base)  # type: ignore[arg-type]


def test_synthetic_determinism_and_seed() -> None:
    cfg = syn(bag_min=1, bag_max=4)
    a = read_all(SyntheticReader(cfg, 256))
    b = read_all(SyntheticReader(cfg, 256))
    for x, y in zip(a, b, strict=True):
        assert_same(x, y)
    c = read_all(SyntheticReader(syn(bag_min=1, bag_max=4, seed=1), 256))
    assert not torch.equal(a[0].labels, c[0].labels) or not torch.equal(a[0].dense, c[0].dense)
    assert not torch.equal(a[0].lengths, c[0].lengths)
    ev = read_all(SyntheticReader(cfg, 256, "eval"))
    assert len(a) == 6 and len(ev) == 2
    assert not torch.equal(ev[0].lengths, a[0].lengths)
    assert a[0].keys == ["C1", "C2", "C3", "C4"] and a[0].dense.shape == (256, 3)
    assert syn(feature_prefix="f").feature_prefix == "f"
    assert SyntheticReader(syn(feature_prefix="f"), 8).keys[:2] == ["f1", "f2"]


def test_synthetic_batch_independent_of_order() -> None:
    r = SyntheticReader(syn(bag_min=0, bag_max=3), 128)
    fresh = SyntheticReader(syn(bag_min=0, bag_max=3), 128).build(4)
    for i in (5, 0, 2):
        r.build(i)
    assert_same(r.build(4), fresh)
    assert list(r.tasks(start_batch=4)) == [4, 5]
    assert fresh.index == 4


def test_synthetic_bag_sizes_and_ids() -> None:
    b = SyntheticReader(syn(bag_min=2, bag_max=5), 512).build(0)
    assert int(b.lengths.min()) == 2 and int(b.lengths.max()) == 5
    assert int(b.lengths.sum()) == b.values.numel()
    assert int(b.values.min()) >= 0
    fixed = SyntheticReader(syn(bag_min=3, bag_max=3), 64).build(0)
    assert set(fixed.lengths.tolist()) == {3}


def test_synthetic_zipf_skew_and_distinct_hot_ids() -> None:
    b = SyntheticReader(syn(num_features=2, vocab_size=100_000, alpha=1.05), 8192).build(0)
    tops = []
    for key in b.keys:
        ids, _ = b.feature(key)
        _, counts = np.unique(ids.numpy(), return_counts=True)
        counts = np.sort(counts)[::-1]
        assert counts[0] > 0.04 * 8192  # rank 0 has p ~ 8%
        assert counts[:10].sum() > 0.2 * 8192
        assert len(counts) < 0.7 * 8192
        vals, cnt = np.unique(ids.numpy(), return_counts=True)
        tops.append(int(vals[np.argmax(cnt)]))
    assert tops[0] != tops[1]  # features have different hot IDs


def test_synthetic_labels_learnable() -> None:
    r = SyntheticReader(syn(num_features=4, num_dense=0, bag_min=1, bag_max=1), 4096)
    b = r.build(0)
    assert 0.05 < float(b.labels.mean()) < 0.95
    ids = b.values.view(4, 4096).numpy()
    w = np.array([[K.hidden_weight(int(x)) for x in row] for row in ids]).sum(0)
    y = b.labels.numpy()
    assert y[w > 1.0].mean() > y[w < -1.0].mean() + 0.3  # label follows the hidden weights


def test_make_reader_synthetic() -> None:
    cfg = DataConfig(reader="synthetic", batch_size=32, synthetic=syn())
    r = make_reader(cfg, "eval")
    assert isinstance(r, SyntheticReader) and r.num_batches == 2


@pytest.mark.parametrize("final_newline", [True, False])
def test_line_chunks_any_block_size(tmp_path: Path, final_newline: bool) -> None:
    lines = [f"line {i} " + "x" * (i % 13) for i in range(1, 48)]
    p = tmp_path / "l.txt"
    p.write_text("\n".join(lines) + ("\n" if final_newline else ""))
    assert count_lines(p) == 47
    for first, num, chunk in [(1, 47, 5), (9, 30, 4), (40, 100, 3), (1, 47, 47), (47, 1, 2)]:
        want = lines[first - 1 : first - 1 + num]
        for block in (1, 7, 64, 1 << 20):
            got = list(line_chunks(p, first, num, chunk, block_bytes=block))
            assert [c[0] for c in got] == list(range(first, first + len(want), chunk))
            assert sum(c[1] for c in got) == len(want)
            text = b"".join(c[2] for c in got).decode().splitlines()
            assert text == want


# --- non-finite values, type errors, empty inputs (issue 11, defect 9) ------------------------
def _criteo_table(criteo: Path, rows: int) -> pa.Table:
    return read_criteo_tsv_table(criteo, rows=rows)


def _with_column(t: pa.Table, name: str, values: list, typ: pa.DataType) -> pa.Table:
    return t.set_column(t.schema.get_field_index(name), name, pa.array(values, typ))


def test_parquet_nan_and_inf_are_both_bad_values_null_is_missing(criteo: Path, tmp_path: Path) -> None:
    t = _criteo_table(criteo, 12)
    i3 = [float(x) if x is not None else None for x in t.column("I3").to_pylist()]
    i3[2], i3[5], i3[8], i3[9] = math.nan, math.inf, -math.inf, None
    p = tmp_path / "nonfinite.parquet"
    pq.write_table(_with_column(t, "I3", i3, pa.float64()), p)
    with pytest.raises(DataError, match=re.escape(f"{p}: row 2 (0-based): integer field I3 nan "
                                                  "is not finite")):
        read_all(ParquetReader(p, 4, "train", 0.0))
    got = read_all(ParquetReader(p, 4, "train", 0.0, on_bad_record="skip"))
    assert [b.bad_records for b in got] == [1, 1, 1]  # rows 2, 5 and 8; the null (9) is missing
    assert sum(b.batch_size for b in got) == 9
    assert all(bool(torch.isfinite(b.dense).all()) for b in got)
    assert float(got[2].dense[0, 2]) == 0.0  # row 9 (row 8 dropped): I3 null -> missing -> 0


def test_parquet_unsupported_column_type_names_the_file(criteo: Path, tmp_path: Path) -> None:
    t = _criteo_table(criteo, 4)
    for name, values, typ in (("label", ["0", "1", "0", "1"], pa.string()),
                              ("I1", [b"1", b"2", b"3", b"4"], pa.binary()),
                              ("C1", [1.0, 2.0, 3.0, 4.0], pa.float64())):
        p = tmp_path / f"type_{name}.parquet"
        pq.write_table(_with_column(t, name, values, typ), p)
        with pytest.raises(DataError, match=re.escape(f"{p}: column {name} has unsupported type")):
            read_all(ParquetReader(p, 4, "train", 0.0))


def test_empty_data_files_are_errors_naming_the_file(criteo: Path, tmp_path: Path) -> None:
    from cosparse.config import EventsConfig
    from cosparse.data.events import TaobaoEventsReader

    tsv = tmp_path / "empty.txt"
    tsv.write_bytes(b"")
    with pytest.raises(DataError, match=re.escape(f"{tsv}: the data file has no lines")):
        read_all(CriteoTSVReader(tsv, 4, "train", 0.2))
    assert read_all(CriteoTSVReader(criteo, 4, "eval", 0.0)) == []  # an empty eval split is fine
    one = tmp_path / "one.txt"
    one.write_text(real_lines(criteo, 1)[0] + "\n")
    with pytest.raises(DataError, match=re.escape(f"{one}: the training split is empty")):
        CriteoTSVReader(one, 4, "train", 0.6).num_batches  # noqa: B018
    pqf = tmp_path / "empty.parquet"
    pq.write_table(_criteo_table(criteo, 3).slice(0, 0), pqf)
    with pytest.raises(DataError, match=re.escape(f"{pqf}: the data file has no rows")):
        ParquetReader(pqf, 4, "train", 0.2)
    ev = tmp_path / "events.csv"
    ev.write_text("")
    with pytest.raises(DataError, match=re.escape(f"{ev}: the data file has no events")):
        TaobaoEventsReader(ev, 4, "train", 0.2, events=EventsConfig())
    ev.write_text("1,10,100,pv,5\n2,20,200,buy,6\n")  # no user has an earlier event
    with pytest.raises(DataError, match=re.escape(f"{ev}: no training samples")):
        TaobaoEventsReader(ev, 4, "train", 0.0, events=EventsConfig())


def test_parquet_huge_integers_are_bad_values_not_a_crash(criteo: Path, tmp_path: Path) -> None:
    """Found by the Parquet fuzzer: a label of 2**53 + 1 crashed the float cast, and a uint64
    I value above int64 wrapped around to a negative number."""
    t = _criteo_table(criteo, 6)
    labels = [0, 1, 2**53 + 1, 0, 1, 0]
    i1 = [1, 2, 3, 2**64 - 1, 10**18, 5]
    t = _with_column(_with_column(t, "label", labels, pa.int64()), "I1", i1, pa.uint64())
    p = tmp_path / "huge.parquet"
    pq.write_table(t, p)
    with pytest.raises(DataError, match=re.escape(f"{p}: row 2 (0-based): bad label 9007199254740993")):
        read_all(ParquetReader(p, 6, "train", 0.0))
    (b,) = read_all(ParquetReader(p, 6, "train", 0.0, on_bad_record="skip"))
    assert b.bad_records == 3 and b.batch_size == 3
    assert b.labels.tolist() == [0.0, 1.0, 0.0]
    pq.write_table(_with_column(t, "label", [0] * 6, pa.int64()), p)
    with pytest.raises(DataError, match=re.escape(f"{p}: row 3 (0-based): integer field I1 "
                                                  f"{2**64 - 1} is out of range")):
        read_all(ParquetReader(p, 6, "train", 0.0))


def test_parquet_invalid_utf8_is_a_data_error(criteo: Path, tmp_path: Path) -> None:
    """Found by the Parquet fuzzer: bytes that are not UTF-8 in a column name of the footer, or
    in a string value, raised UnicodeDecodeError."""
    t = _criteo_table(criteo, 4)
    p = tmp_path / "names.parquet"
    pq.write_table(t, p, compression="NONE")
    data = p.read_bytes()
    assert data.count(b"\x05label") >= 1  # the name in the Parquet schema (thrift)
    p.write_bytes(data.replace(b"\x05label", b"\x05\x80abel"))
    with pytest.raises(DataError, match=re.escape(f"{p}: cannot read as Parquet")):
        ParquetReader(p, 4, "train", 0.0)
    q = tmp_path / "values.parquet"
    pq.write_table(_with_column(t, "C3", ["zqzqzqzq"] * 4, pa.string()), q, compression="NONE",
                   use_dictionary=False)
    data = q.read_bytes()
    assert data.count(b"zqzqzqzq") >= 4
    q.write_bytes(data.replace(b"zqzqzqzq", b"\x80qzqzqzq"))
    with pytest.raises(DataError, match=re.escape(f"{q}: row 0 (0-based): non-hex categorical "
                                                  "field C3 b'\\x80qzqzqzq'")):
        read_all(ParquetReader(q, 4, "train", 0.0))
