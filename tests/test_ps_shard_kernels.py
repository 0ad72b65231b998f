"""The PS shard's fused kernels (``cosparse.ps.shard_kernels`` through ``ShardTable``) against the
reference path: ``initial_rows`` for new rows and ``SparseOptimizer.update`` on gathered rows for
pushes, bit for bit, for every optimizer; versions and dirty flags; new and known IDs, peeks,
empty requests, the parallel variants; and refused requests (foreign IDs, duplicates, non-finite
gradients, a full budget) that change nothing."""

from __future__ import annotations

import numpy as np
import pytest

from cosparse.config import InitConfig, OptimizerConfig, TableConfig
from cosparse.optim import SparseOptimizer
from cosparse.ps.limits import ShardError
from cosparse.ps.protocol import shard_of
from cosparse.ps.shard_table import ShardTable
from cosparse.store import kernels as store_kernels
from cosparse.store.kernels.rows import init_row, init_seed
from cosparse.store.resident import initial_rows

KINDS = ["sgd", "adagrad", "rowwise_adagrad", "adam"]


def _cfg(kind: str, dim: int = 16, l2: float = 0.0, init: str = "uniform") -> TableConfig:
    ini = InitConfig(kind="uniform", low=-0.05, high=0.05) if init == "uniform" else \
        InitConfig(kind="normal", std=0.02)
    return TableConfig("t", dim=dim, init=ini, seed=11,
                       optimizer=OptimizerConfig(kind=kind, lr=0.05, l2=l2))


class Reference:
    """The all-resident engine's arithmetic on a dict of rows: ``initial_rows`` for a new ID,
    ``SparseOptimizer.update`` over gathered rows for a push."""

    def __init__(self, cfg: TableConfig, width: int) -> None:
        self.cfg, self.width = cfg, width
        self.opt = SparseOptimizer(cfg.optimizer)
        self.rows: dict[int, np.ndarray] = {}
        self.versions: dict[int, int] = {}

    def _ensure(self, ids: np.ndarray) -> None:
        new = np.array([i for i in dict.fromkeys(ids.tolist()) if i not in self.rows], np.int64)
        if new.shape[0]:
            fresh = initial_rows(self.cfg, self.width, new)
            for k, row in zip(new.tolist(), fresh, strict=True):
                self.rows[k], self.versions[k] = row.copy(), 0

    def pull(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self._ensure(ids)
        return (np.stack([self.rows[k] for k in ids.tolist()]) if ids.shape[0] else
                np.zeros((0, self.width), np.float32),
                np.array([self.versions[k] for k in ids.tolist()], np.int64))

    def push(self, ids: np.ndarray, grads: np.ndarray, step: int) -> None:
        self._ensure(ids)
        dim = self.cfg.dim
        full = np.stack([self.rows[k] for k in ids.tolist()])
        w, s = np.ascontiguousarray(full[:, :dim]), np.ascontiguousarray(full[:, dim:])
        dest = np.empty_like(full)
        self.opt.update(w, s, grads, step, dest, np.arange(ids.shape[0], dtype=np.int64))
        for k, row in zip(ids.tolist(), dest, strict=True):
            self.rows[k] = row
            self.versions[k] += 1


def _same(table: ShardTable, ref: Reference, ids: np.ndarray) -> None:
    rows, versions = table.pull(ids, True, True, None)  # a peek: changes nothing
    want_rows, want_versions = ref.pull(ids)
    assert rows.tobytes() == want_rows.tobytes()
    assert np.array_equal(versions, want_versions)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind", KINDS)
def test_pull_and_push_are_bit_identical_to_the_reference(kind: str, threads: int) -> None:
    cfg = _cfg(kind, l2=0.01 if kind == "adagrad" else 0.0,
               init="normal" if kind == "adam" else "uniform")
    t = ShardTable(cfg, initial_rows=16)  # small: the map and the arrays grow on the way
    t.threads = threads
    ref = Reference(cfg, t.width)
    rng = np.random.default_rng(3)
    universe = rng.choice(1 << 50, size=3000, replace=False).astype(np.int64) - (1 << 49)
    for step in range(1, 9):
        ids = rng.choice(universe, size=400, replace=False)
        rows, versions = t.pull(ids, step % 2 == 0, False, None)
        want_rows, want_versions = ref.pull(ids)
        cols = t.width if step % 2 == 0 else t.dim
        assert rows.shape == (400, cols) and rows.tobytes() == want_rows[:, :cols].tobytes()
        assert np.array_equal(versions, want_versions)
        push_ids = rng.choice(universe, size=300, replace=False)  # some never pulled: created
        grads = rng.standard_normal((300, cfg.dim)).astype(np.float32)
        t.push(push_ids, grads, step, None)
        ref.push(push_ids, grads, step)
    assert t.rows == len(ref.rows)
    _same(t, ref, np.array(sorted(ref.rows), np.int64))
    assert t.dirty.all()
    t.clean()
    assert not t.dirty.any()


def test_init_row_is_init_rows_bit_for_bit() -> None:
    import numba

    @numba.njit
    def one_by_one(slab, ids, seed, dim, kind, a, b, state, col0):
        s64 = init_seed(seed)
        for i in range(ids.shape[0]):
            init_row(slab, i, ids[i], s64, dim, kind, a, b, state, col0)

    ids = np.random.default_rng(0).integers(-(1 << 62), 1 << 62, size=500, dtype=np.int64)
    for kind, a, b in ((0, -0.1, 0.2), (1, 0.03, 0.0)):
        for col0 in (0, 5):
            want = np.empty((500, 13), np.float32)
            got = np.empty((500, 13), np.float32)
            store_kernels.init_rows(want, np.arange(500), ids, 7, 12, kind, a, b, np.float32(0.1),
                                    col0)
            one_by_one(got, ids, 7, 12, kind, a, b, np.float32(0.1), col0)
            assert got.tobytes() == want.tobytes()


def test_peek_reads_initial_values_and_creates_nothing() -> None:
    cfg = _cfg("rowwise_adagrad")
    t = ShardTable(cfg)
    known = np.arange(10, dtype=np.int64)
    t.pull(known, False, False, None)
    ids = np.array([3, 100, 4, 101, 100], np.int64)
    rows, versions = t.pull(ids, True, True, None)
    assert versions.tolist() == [0, -1, 0, -1, -1]
    assert rows.tobytes() == initial_rows(cfg, t.width, ids).tobytes()
    assert t.rows == 10


def test_duplicate_ids_in_a_pull_share_one_new_row() -> None:
    t = ShardTable(_cfg("sgd"))
    rows, versions = t.pull(np.array([7, 8, 7, 7], np.int64), False, False, None)
    assert t.rows == 2 and versions.tolist() == [0, 0, 0, 0]
    assert rows[0].tobytes() == rows[2].tobytes() == rows[3].tobytes()


def test_empty_requests() -> None:
    t = ShardTable(_cfg("adam"))
    rows, versions = t.pull(np.zeros(0, np.int64), True, False, None)
    assert rows.shape == (0, t.width) and versions.shape == (0,)
    t.push(np.zeros(0, np.int64), np.zeros((0, t.dim), np.float32), 1, None)
    assert t.rows == 0


def _state(t: ShardTable) -> tuple:
    n, live = t.rows, t.vals >= 0  # (an erased bucket keeps its old key bytes)
    return (n, sorted(zip(t.keys[live].tolist(), t.vals[live].tolist(), strict=True)),
            t.slab[:n].tobytes(), t.versions[:n].tobytes(), t.flags[:n].tobytes())


def test_refused_requests_change_nothing() -> None:
    t = ShardTable(_cfg("rowwise_adagrad"))
    t.pull(np.arange(20, dtype=np.int64), False, False, None)
    t.push(np.arange(5, dtype=np.int64), np.ones((5, t.dim), np.float32), 1, None)
    before = _state(t)
    g = np.ones((4, t.dim), np.float32)
    with pytest.raises(ShardError, match="unique"):  # a duplicate new ID, then a known one
        t.push(np.array([100, 101, 100, 3], np.int64), g, 2, None)
    assert _state(t) == before
    with pytest.raises(ShardError, match="unique"):
        t.push(np.array([1, 2, 1, 102], np.int64), g, 2, None)
    assert _state(t) == before
    bad = g.copy()
    bad[2, 3] = np.nan
    with pytest.raises(ShardError, match="NaN or infinite values in 1 of 4 rows"):
        t.push(np.array([1, 2, 103, 4], np.int64), bad, 2, None)
    assert _state(t) == before
    with pytest.raises(ShardError, match="3 new rows do not fit the 2 rows left") as e:
        t.push(np.array([1, 200, 201, 202], np.int64), g, 2, 2)
    assert e.value.kind == "full" and _state(t) == before
    with pytest.raises(ShardError, match="2 new rows do not fit the 1 rows left"):
        t.pull(np.array([300, 1, 301, 300], np.int64), False, False, 1)
    assert _state(t) == before
    t.pull(np.array([300, 1, 300], np.int64), False, False, 1)  # exactly the budget: fits
    assert t.rows == 21


def test_foreign_ids_are_refused_naming_them() -> None:
    t = ShardTable(_cfg("sgd"))
    ids = np.arange(40, dtype=np.int64)
    mine = ids[shard_of(ids, 3) == 1]
    t.pull(mine, False, False, None, shard=1, num_shards=3)
    before = _state(t)
    with pytest.raises(ShardError, match=r"shard 1/3 does not own \d+ of the IDs") as e:
        t.pull(ids, False, False, None, shard=1, num_shards=3)
    assert e.value.kind == "owner" and _state(t) == before
    with pytest.raises(ShardError, match="does not own"):
        t.push(ids, np.zeros((40, t.dim), np.float32), 1, None, shard=1, num_shards=3)
    assert _state(t) == before


def test_pull_fills_the_given_reply_buffers() -> None:
    t = ShardTable(_cfg("adagrad"))
    buf = np.empty(5 * 8 + 5 * t.dim * 4, np.uint8)
    versions = buf[:40].view(np.int64)
    rows = buf[40:].view(np.float32).reshape(5, t.dim)
    ids = np.arange(5, dtype=np.int64)
    got_rows, got_versions = t.pull(ids, False, False, None, out=(rows, versions))
    assert got_rows is rows and got_versions is versions
    assert rows.tobytes() == initial_rows(t.cfg, t.width, ids)[:, : t.dim].tobytes()


def test_ps_serve_shard_threads_serves_the_same_rows(tmp_path) -> None:
    from cosparse.ps import EmbeddedShards

    cfg = _cfg("rowwise_adagrad")
    ids = np.arange(3000, dtype=np.int64) * 31
    grads = np.random.default_rng(5).standard_normal((3000, cfg.dim)).astype(np.float32)
    seen = []
    for threads in (1, 2):
        with EmbeddedShards(2, [cfg], tmp_path / f"t{threads}", threads=threads) as shards, \
                shards.client() as c:
            assert [st["threads"] for st in c.stats()] == [threads, threads]
            c.pull("t", ids[::2])
            c.push("t", ids, grads, 1)
            got = c.pull("t", ids, with_state=True)
            seen.append((got.rows.tobytes(), got.versions.tolist()))
    assert seen[0] == seen[1]


def test_shard_threads_below_one_is_refused(tmp_path) -> None:
    from cosparse.ps.server import ServeOptions, Server

    with pytest.raises(ValueError, match="--shard-threads 0: at least 1"):
        Server(ServeOptions(shard=0, num_shards=1, data_dir=str(tmp_path), shard_threads=0))
