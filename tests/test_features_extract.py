"""Extract once, fan out: one extraction per batch serves several consumers; FeatureReader on real
Criteo data (also in worker processes); Parquet raw sources; materialize -> read back."""

from __future__ import annotations

import pickle
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from cosparse.batch import SparseBatch
from cosparse.cli import main
from cosparse.data import BatchStream, CriteoTSVReader, DataError
from cosparse.data.reader import Reader
from cosparse.features import (
    CriteoRawSource,
    FeatureExtractor,
    FeatureReader,
    FeatureSpecError,
    MaterializedReader,
    ParquetRawSource,
    load_spec,
    materialize,
    parse_spec,
)

ROOT = Path(__file__).resolve().parents[1]
CRITEO = ROOT.parent / "shared/data/criteo/train_head10k.txt"
SPEC = ROOT / "configs/features/criteo.yaml"


@pytest.fixture
def criteo() -> Path:
    if not CRITEO.is_file():
        pytest.skip(f"{CRITEO} not present")
    return CRITEO


def assert_same(a: SparseBatch, b: SparseBatch) -> None:
    assert a.keys == b.keys and a.index == b.index and a.dense_keys == b.dense_keys
    for f in ("values", "lengths", "dense", "labels"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f


def test_extract_once_for_two_consumers(criteo: Path) -> None:
    fs = load_spec(SPEC)
    src = CriteoRawSource(criteo, 2048, "train", 0.2)
    (s1, d1), (s2, d2) = fs.consumer_keys("dlrm_v1"), fs.consumer_keys("deepfm_v1")
    union = list(dict.fromkeys(s1 + d1 + s2 + d2))
    ex = FeatureExtractor(fs, union)
    closure = fs.closure(union)
    assert len(closure) < len(s1 + d1) + len(s2 + d2)  # overlap: fewer computations than separately
    tasks = list(src.tasks())
    for t in tasks:
        fb = ex.extract(src.build_raw(t))
        assert fb.computed == len(closure)
        b1, b2 = fb.to_sparse_batch(s1, d1), fb.to_sparse_batch(s2, d2)
        assert b1.keys == s1 and b1.dense_keys == d1 and b1.dense.shape == (fb.num_rows, 13)
        assert b2.keys == s2 and b2.dense_keys == [] and b2.dense.shape == (fb.num_rows, 0)
        assert b1.features_computed == len(closure)
        # the shared features are the same IDs in both batches
        for k in set(s1) & set(s2):
            assert all(torch.equal(x, y) for x, y in zip(b1.feature(k), b2.feature(k), strict=True))
    assert ex.computed == len(closure) * len(tasks) and ex.batches == len(tasks)


def test_feature_reader_matches_plain_criteo_reader(criteo: Path) -> None:
    fs = load_spec(SPEC)
    dense = [f"i{i}_log" for i in range(1, 14)]
    fr = FeatureReader(CriteoRawSource(criteo, 1024, "eval", 0.2), fs, ["c1", "c1_x_c2"], dense)
    assert isinstance(fr, Reader) and fr.num_dense == 13 and fr.keys == ["c1", "c1_x_c2"]
    plain = CriteoTSVReader(criteo, 1024, "eval", 0.2)
    assert fr.num_batches == plain.num_batches == 2
    for t, pt in zip(fr.tasks(), plain.tasks(), strict=True):
        b, p = fr.build(t), plain.build(pt)
        assert torch.equal(b.dense, p.dense) and torch.equal(b.labels, p.labels) and b.index == p.index
        ids, lens = b.feature("c1")
        pids, plens = p.feature("C1")
        assert torch.equal(lens, plens) and len(ids) == len(pids)
        assert int(ids.max()) < 1000003 and int(ids.min()) >= 0
        cross_lens = b.feature("c1_x_c2")[1]
        assert torch.equal(cross_lens, plens * p.feature("C2")[1])  # missing in any -> missing


def test_feature_reader_in_worker_processes(criteo: Path) -> None:
    fs = load_spec(SPEC)
    r = FeatureReader.for_model(CriteoRawSource(criteo, 2500, "train", 0.2), fs, "deepfm_v1")
    pickle.loads(pickle.dumps(r))
    ref = list(BatchStream(r, workers=0))
    with BatchStream(r, workers=1, queue_depth=2) as s:
        got = list(s)
    assert len(got) == len(ref) == 4
    for a, b in zip(ref, got, strict=True):
        assert_same(a, b)
        assert b.features_computed == len(fs.closure(r.keys))


def test_bad_line_names_file_and_line(tmp_path: Path, criteo: Path) -> None:
    lines = criteo.read_text().splitlines()[:20]
    lines[6] = lines[6].replace("\t", "\tzz", 1)
    p = tmp_path / "bad.txt"
    p.write_text("\n".join(lines) + "\n")
    fs = load_spec(SPEC)
    r = FeatureReader.for_model(CriteoRawSource(p, 8, "train", 0.0), fs, "dlrm_v1")
    with pytest.raises(DataError, match=rf"{p}:7: non-numeric integer field I1"):
        [r.build(t) for t in r.tasks()]
    rs = FeatureReader.for_model(CriteoRawSource(p, 8, "train", 0.0, "skip"), fs, "dlrm_v1")
    bs = [rs.build(t) for t in rs.tasks()]
    assert [b.bad_records for b in bs] == [1, 0, 0] and sum(b.batch_size for b in bs) == 19


def test_reader_checks_the_source_at_start_up(criteo: Path) -> None:
    fs = parse_spec({"features": [{"name": "u", "inputs": ["user_id"], "kind": "sparse",
                                   "transforms": [{"hash": {}}]}]})
    with pytest.raises(FeatureSpecError, match="feature 'u'.inputs: unknown input 'user_id'"):
        FeatureReader(CriteoRawSource(criteo, 100), fs, ["u"])
    fs = load_spec(SPEC)
    with pytest.raises(FeatureSpecError, match="feature 'i1_log' is dense but listed as sparse"):
        FeatureReader(CriteoRawSource(criteo, 100), fs, ["i1_log"])


def test_parquet_raw_source_with_list_and_string_columns(tmp_path: Path) -> None:
    n = 10
    t = pa.table({
        "label": pa.array([i % 2 for i in range(n)], pa.int8()),
        "user": pa.array([f"u{i % 3}" if i != 4 else None for i in range(n)]),
        "age": pa.array([float(i) if i != 2 else None for i in range(n)]),
        "ts": pa.array([100 + i for i in range(n)], pa.int64()),
        "items": pa.array([list(range(i)) for i in range(n)], pa.list_(pa.int64())),
        "item_ts": pa.array([[90 + i + j for j in range(i)] for i in range(n)], pa.list_(pa.int64())),
        "tags": pa.array([["a", "b"][: i % 3] for i in range(n)], pa.list_(pa.string())),
    })
    path = tmp_path / "ev.parquet"
    pq.write_table(t, path, row_group_size=4)
    spec = {"features": [
        {"name": "user_id", "inputs": ["user"], "transforms": [{"vocab": {"values": ["u0", "u1"]}}],
         "kind": "sparse"},
        {"name": "age_f", "inputs": ["age"], "transforms": [{"fill_missing": {"value": -1.0}}],
         "kind": "dense"},
        {"name": "recent", "inputs": ["items", "item_ts", "ts"], "kind": "sequence",
         "transforms": [{"history": {"window_s": 5, "max_len": 3}}, {"hash": {"buckets": 100}}]},
        {"name": "tag_ids", "inputs": ["tags"], "transforms": [{"hash": {"seed": 1}}], "kind": "sparse"},
        {"name": "last2", "inputs": ["items"], "kind": "sequence",
         "transforms": [{"truncate": {"max_len": 2, "pad": True}}]},
    ]}
    fs = parse_spec(spec)
    src = ParquetRawSource(path, 4, "train", 0.0)
    assert src.columns == {"user": "string", "age": "float", "ts": "int", "items": "list_int",
                           "item_ts": "list_int", "tags": "list_string"}
    r = FeatureReader(src, fs, ["user_id", "recent", "tag_ids", "last2"], ["age_f"])
    bs = [r.build(tk) for tk in r.tasks()]
    assert [b.batch_size for b in bs] == [4, 4, 2]
    user = torch.cat([b.feature("user_id")[0] for b in bs]).tolist()
    assert user == [0, 1, 2, 0, 2, 0, 1, 2, 0]  # u2 is OOV (2), row 4 is null -> empty bag
    assert torch.cat([b.dense[:, 0] for b in bs]).tolist() == [0, 1, -1, 3, 4, 5, 6, 7, 8, 9]
    # history: item j of row i has time 90+i+j, ts 100+i: window [95+i, 100+i) keeps j >= 5, capped 3
    rec_lens = torch.cat([b.feature("recent")[1] for b in bs]).tolist()
    assert rec_lens == [0, 0, 0, 0, 0, 0, 1, 2, 3, 3]
    assert torch.cat([b.feature("last2")[1] for b in bs]).tolist() == [2] * 10
    assert torch.cat([b.feature("tag_ids")[1] for b in bs]).tolist() == [i % 3 for i in range(n)]
    assert torch.cat([b.labels for b in bs]).tolist() == [i % 2 for i in range(n)]


def test_parquet_bad_label_names_row(tmp_path: Path) -> None:
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"label": [0, 1, 7], "x": [1, 2, 3]}), path)
    fs = parse_spec({"features": [{"name": "xf", "inputs": ["x"], "kind": "sparse"}]})
    r = FeatureReader(ParquetRawSource(path, 10, "train", 0.0), fs, ["xf"])
    with pytest.raises(DataError, match=r"bad.parquet: row 2 \(0-based\): bad label label 7"):
        r.build(next(iter(r.tasks())))


def test_materialize_reads_back_identically_and_refuses_stale(criteo: Path, tmp_path: Path) -> None:
    fs = load_spec(SPEC)
    out = tmp_path / "mat"
    sparse, dense = fs.consumer_keys("dlrm_v1")
    m = materialize(CriteoRawSource(criteo, 3000, "train", 0.0), fs, out, sparse + dense, progress_every=0)
    assert m["rows"] == 10000 and (out / f"c1@{fs.versions['c1']}.parquet").is_file()
    for split in ("train", "eval"):
        mr = MaterializedReader(out, fs, sparse, dense, 1000, split, 0.2)
        fr = FeatureReader(CriteoRawSource(criteo, 1000, split, 0.2), fs, sparse, dense)
        assert isinstance(mr, Reader) and mr.num_batches == fr.num_batches
        for a, b in zip(mr.tasks(), fr.tasks(), strict=True):
            x, y = mr.build(a), fr.build(b)
            assert_same(x, y)
            assert x.features_computed == 0 and y.features_computed > 0
    # a changed spec: the materialization is stale for the changed feature and its downstream
    doc = yaml.safe_load(SPEC.read_text())
    next(f for f in doc["features"] if f["name"] == "c2")["transforms"] = [{"hash": {"seed": 12}}]
    fs2 = parse_spec(doc)
    MaterializedReader(out, fs2, ["c1"], dense, 1000)  # untouched features still read
    with pytest.raises(FeatureSpecError, match=rf"feature 'c2': materialization in .* is stale: it holds "
                                               rf"version {fs.versions['c2']}, the spec now produces "
                                               rf"{fs2.versions['c2']}"):
        MaterializedReader(out, fs2, sparse, dense, 1000)
    with pytest.raises(FeatureSpecError, match="feature 'c1_x_c2': materialization .* is stale"):
        MaterializedReader(out, fs2, ["c1_x_c2"], [], 1000)
    with pytest.raises(FeatureSpecError, match="feature 'i1_bucket' .* is not materialized"):
        MaterializedReader(out, fs, ["i1_bucket"], [], 1000)


def test_cli_fit_then_materialize_with_quantiles(criteo: Path, tmp_path: Path, capsys) -> None:
    spec = tmp_path / "q.yaml"
    spec.write_text(yaml.safe_dump({"features": [
        {"name": "c1", "inputs": ["C1"], "transforms": [{"hash": {"seed": 1}}], "kind": "sparse"},
        {"name": "i5_q", "inputs": ["I5"], "transforms": [{"bucketize": {"quantiles": 8}}],
         "kind": "sparse", "table": "bucket"},
    ]}))
    out = tmp_path / "m"
    # an unfitted spec is refused: its boundaries (part of the version) would depend on the run
    assert main(["features", "materialize", "--spec", str(spec), "--data", str(criteo),
                 "--out", str(out)]) == 2
    assert "i5_q' buckets by quantiles that are not fitted" in capsys.readouterr().err
    fitted_spec = tmp_path / "q.fitted.yaml"
    assert main(["features", "fit", "--spec", str(spec), "--data", str(criteo), "--out",
                 str(fitted_spec), "--rows", "5000"]) == 0
    capsys.readouterr()
    fitted = load_spec(fitted_spec)
    again = load_spec(fitted_spec)
    assert not fitted.unfitted() and fitted.versions == again.versions  # stable once fitted
    assert fitted.versions["i5_q"] != load_spec(spec).versions["i5_q"]
    sample = CriteoRawSource(criteo, 5000, "train", 0.2)  # the first 5000 training rows
    assert fitted.fitted() == load_spec(spec).fit(sample.build_raw(next(iter(sample.tasks())))).fitted()
    assert main(["features", "materialize", "--spec", str(fitted_spec), "--data", str(criteo),
                 "--out", str(out), "--batch-size", "4000", "--progress-every", "1"]) == 0
    cap = capsys.readouterr()
    assert "materialize: batch 3/3, 10000 rows" in cap.err and '"rows": 10000' in cap.out
    mr = MaterializedReader(out, fitted, ["c1", "i5_q"], [], 5000, "train", 0.0)
    b = mr.build(next(iter(mr.tasks())))
    ids = b.feature("i5_q")[0]
    assert int(ids.max()) <= 7 and len(torch.unique(ids)) >= 6
    fr = FeatureReader(CriteoRawSource(criteo, 5000, "train", 0.0), fitted, ["c1", "i5_q"])
    assert_same(b, fr.build(next(iter(fr.tasks()))))
    assert main(["features", "materialize", "--spec", str(fitted_spec), "--data",
                 str(tmp_path / "none.txt"), "--out", str(out)]) == 3
