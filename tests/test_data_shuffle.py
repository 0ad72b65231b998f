"""``data.shuffle``: every reader's training rows permuted within seeded windows; the same rows
as file order, each batch built from exactly its own rows, the same batches on resume, and
training bit-identical across placements and resume."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from cosparse.config import ConfigError, ShuffleConfig, config_from_mapping
from cosparse.data import make_reader
from cosparse.data.parquet import write_criteo_parquet
from cosparse.data.shuffle import shuffled_batches
from cosparse.train.inputs import model_inputs
from cosparse.train.trainer import Trainer

SHARED = Path(__file__).resolve().parents[2] / "shared/data"
CRITEO = SHARED / "criteo/train_head10k.txt"
TAOBAO = SHARED / "taobao-userbehavior/UserBehavior_head84k.csv"
needs_criteo = pytest.mark.skipif(not CRITEO.exists(), reason="../shared/data/criteo is absent")


def test_windows_are_permuted_seeded_and_resumable():
    sh = ShuffleConfig(buffer=250, seed=3)  # windows of 3 batches of 100 rows
    batches = list(shuffled_batches(1000, 1050, 100, sh))
    assert [i for i, _ in batches] == list(range(11))
    assert [len(r) for _, r in batches] == [100] * 10 + [50]
    for w in range(4):
        rows = np.concatenate([r for i, r in batches if i // 3 == w])
        lo = 1000 + w * 300
        assert sorted(rows.tolist()) == list(range(lo, min(lo + 300, 2050)))
        assert rows.tolist() != sorted(rows.tolist())
    again = list(shuffled_batches(1000, 1050, 100, sh, start_batch=4))
    assert [i for i, _ in again] == list(range(4, 11))
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(batches[4:], again, strict=True))
    other = list(shuffled_batches(1000, 1050, 100, ShuffleConfig(buffer=250, seed=4)))
    assert not np.array_equal(other[0][1], batches[0][1])


def _csv(tmp_path: Path, n: int = 300) -> Path:
    p = tmp_path / "log.csv"
    p.write_text("user,item,label\n" + "".join(
        f"u{i % 17},i{i},{(i * 7) % 3 == 0:d}\n" for i in range(n)))
    return p


def _row_ids(reader, task) -> np.ndarray:
    """The file rows of a task, whatever the reader."""
    source = getattr(reader, "source", None)
    if source is not None and hasattr(source, "build_rows"):
        return source.build_rows(task)[1]
    if hasattr(reader, "targets"):  # sequence samples: their target events
        return reader.targets(task.positions)[0]
    for attr in ("lines", "take"):
        rows = getattr(task, attr, None)
        if rows is not None:
            return np.asarray(rows)
    if hasattr(task, "first_line"):
        return np.arange(task.first_line, task.first_line + task.num_lines)
    return np.arange(task.row_start, task.row_start + task.num_rows)


def _readers(kind: str, tmp_path: Path, shuffle: dict | None):
    if kind == "criteo_tsv":
        data = {"reader": "criteo_tsv", "path": str(CRITEO), "batch_size": 500}
    elif kind == "parquet":
        path = write_criteo_parquet(CRITEO, tmp_path / "c.parquet", rows=3000,
                                    row_group_size=700)
        data = {"reader": "parquet", "path": str(path), "batch_size": 200}
    elif kind == "taobao_events":
        data = {"reader": "taobao_events", "path": str(TAOBAO), "batch_size": 1000,
                "events": {"shuffle": False}}
    else:
        data = {"reader": "csv", "path": str(_csv(tmp_path)), "batch_size": 32,
                "split": {"by": "hash", "key": "user", "eval_fraction": 0.2}}
    raw = {"data": {**data, "shuffle": shuffle},
           "tables": [{"name": "t", "dim": 4, "features": "auto" if kind == "csv" else
                       (["item"] if kind == "taobao_events" else ["C1"])}],
           "model": {"kind": "din" if kind == "taobao_events" else "dlrm", "bottom": [4],
                     "top": [4, 1]},
           "train": {"progress": False}}
    if kind == "taobao_events":
        raw["model"]["din"] = {"pairs": [["item", "hist_item"]]}
        raw["tables"] = [{"name": "item", "dim": 4, "features": ["item"]},
                         {"name": "hist", "dim": 4, "features": ["hist_item"], "pooling": "none"}]
    cfg = config_from_mapping(raw)
    if kind == "csv":
        inputs = model_inputs(cfg)
        return inputs.train, inputs.eval
    return make_reader(cfg.data, "train"), make_reader(cfg.data, "eval")


@pytest.mark.parametrize("kind", [
    pytest.param("criteo_tsv", marks=needs_criteo),
    pytest.param("parquet", marks=needs_criteo),
    "csv",
    pytest.param("taobao_events", marks=pytest.mark.skipif(not TAOBAO.exists(),
                                                           reason="no taobao data")),
])
def test_every_reader_shuffles_its_training_rows_within_windows(tmp_path, kind):
    plain, plain_eval = _readers(kind, tmp_path, None)
    bs = len(_row_ids(plain, next(iter(plain.tasks()))))
    sh, sh_eval = _readers(kind, tmp_path, {"buffer": 2 * bs + 1, "seed": 9})
    plain_tasks, tasks = list(plain.tasks()), list(sh.tasks())
    assert len(tasks) == len(plain_tasks) == plain.num_batches
    plain_rows = [_row_ids(plain, t) for t in plain_tasks]
    rows = [_row_ids(sh, t) for t in tasks]
    # windows of 3 batches: each window holds the same rows, in another order
    for w in range(0, len(tasks), 3):
        a, b = np.concatenate(plain_rows[w:w + 3]), np.concatenate(rows[w:w + 3])
        assert sorted(a.tolist()) == sorted(b.tolist())
        if len(a) > 10:
            assert a.tolist() != b.tolist()
    # each batch is built from its own rows: labels and IDs follow the rows
    by_row_label, by_row_ids = {}, {}
    for t, r in zip(plain_tasks, plain_rows, strict=True):
        b = plain.build(t)
        by_row_label.update(zip(r.tolist(), b.labels.tolist(), strict=True))
        by_row_ids.update(zip(r.tolist(), _first_ids(b), strict=True))
    for t, r in zip(tasks, rows, strict=True):
        b = sh.build(t)
        assert b.labels.tolist() == [by_row_label[x] for x in r.tolist()]
        assert _first_ids(b) == [by_row_ids[x] for x in r.tolist()]
    # resume mid-window: the same batches; eval is never shuffled
    k = len(tasks) // 2 + 1
    assert [_row_ids(sh, t).tolist() for t in sh.tasks(k)] == [x.tolist() for x in rows[k:]]
    assert ([_row_ids(sh_eval, t).tolist() for t in sh_eval.tasks()]
            == [_row_ids(plain_eval, t).tolist() for t in plain_eval.tasks()])


def _first_ids(batch) -> list[int]:
    """Per sample: the first ID of the batch's first feature (-1 for an empty bag)."""
    values, lengths = (x.numpy() for x in batch.feature(batch.keys[0]))
    starts = np.cumsum(lengths) - lengths
    return np.where(lengths > 0, values[np.minimum(starts, len(values) - 1)], -1).tolist()


def _criteo_run(tmp_path: Path, steps: int, shuffle: dict | None, device_rows: int | None = None,
                every: int = 0) -> dict:
    raw = {"data": {"reader": "criteo_tsv", "path": str(CRITEO), "batch_size": 512,
                    "shuffle": shuffle},
           "model": {"kind": "dlrm", "bottom": [16, 8], "top": [16, 1]},
           "tables": [{"name": "cat", "dim": 8, "features": [f"C{k}" for k in range(1, 27)],
                       "optimizer": {"kind": "rowwise_adagrad", "lr": 0.05}}],
           "supply": {"lookahead": 2},
           "train": {"steps": steps, "epochs": 2, "progress": False, "log_every": 4,
                     "threads": 2, "checkpoint": {"dir": str(tmp_path / "ck"), "every": every}}}
    if device_rows is not None:
        raw["store"] = {"device": {"rows": device_rows}}
    return copy.deepcopy(raw)


def _train(raw: dict, resume: str | None = None) -> list[float]:
    t = Trainer(config_from_mapping(raw), log=lambda m: None)
    try:
        if resume:
            t.resume(resume)
        t.run()
        return list(t.losses)
    finally:
        t.close()


@needs_criteo
def test_shuffled_training_is_bit_identical_across_placements_and_resume(tmp_path):
    sh = {"buffer": 2000, "seed": 1}
    resident = _train(_criteo_run(tmp_path / "r", 20, sh))
    tiered = _train(_criteo_run(tmp_path / "t", 20, sh, device_rows=9000))
    assert tiered == resident
    assert _train(_criteo_run(tmp_path / "p", 20, None)) != resident  # the order mattered
    first = _train(_criteo_run(tmp_path / "c", 12, sh, every=12))
    rest = _train(_criteo_run(tmp_path / "c", 20, sh), resume=str(tmp_path / "c" / "ck"))
    assert first + rest == resident  # resumed mid-epoch, mid-window, and across the epoch


@pytest.mark.parametrize("data, message", [
    ({"shuffle": {"buffer": 0}}, "data.shuffle.buffer"),
    ({"shuffle": {"buffer": 10, "seed": -1}}, "data.shuffle.seed"),
    ({"shuffle": {"buffer": 10}, "reader": "synthetic", "path": None}, "data.shuffle: reader"),
    ({"shuffle": {"buffer": 10}, "reader": "taobao_events"}, "data.events.shuffle"),
])
def test_bad_shuffle_keys_are_config_errors_naming_the_key(tmp_path, data, message):
    raw = {"data": {"reader": "csv", "path": str(_csv(tmp_path)), **data},
           "tables": [{"name": "t", "dim": 4, "features": ["C1"]}]}
    with pytest.raises(ConfigError, match=message):
        config_from_mapping(raw)


@needs_criteo
def test_the_feature_platform_shuffles_its_raw_rows_like_the_reader(tmp_path):
    sh = {"buffer": 1500, "seed": 2}
    plain = _criteo_run(tmp_path / "a", 6, sh)
    spec = _criteo_run(tmp_path / "b", 6, sh)
    spec["features"] = {"spec": str(Path(__file__).resolve().parents[1]
                                     / "configs/features/criteo_plain.yaml"),
                        "consumer": "criteo_plain"}
    del spec["tables"][0]["features"]
    assert _train(spec) == _train(plain)
