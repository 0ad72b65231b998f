"""Fuzzing a real `cosparse ps serve` process's state, beside ``test_ps_fuzz.py``'s hostile
messages (issue 31): many clients pulling replies of mixed sizes at once; pushes whose result
would overflow float32 (refused whole, nothing applied, counted); and a shard that stays within
its byte budget whatever tables and rows it is asked for. Each test prints how many cases it ran;
``COSPARSE_FUZZ_SCALE=10`` runs ten times the examples.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from ps_fuzz_target import MAX_MESSAGE, SCALE, TABLES, Target, _run, _settings, serve_target

from cosparse.config import OptimizerConfig, TableConfig
from cosparse.ps import EmbeddedShards
from cosparse.ps.errors import PSError


@pytest.fixture(scope="module", params=["plain", "hmac"])
def target(request, tmp_path_factory):
    yield from serve_target(request.param, tmp_path_factory)


def test_concurrent_pulls_of_mixed_sizes_all_succeed(target, capsys):
    """Issue 31, item 1: several clients at once, each pulling replies of mixed sizes up to the
    shard's message limit (so reply buffers of many size classes are in flight and the pool
    forgets some), every pull succeeds and returns the rows a single client read first."""
    t0 = time.perf_counter()
    universe = np.arange(50_000, dtype=np.int64)
    reference = target.client.pull("probe", universe, peek=True).rows
    row_bytes = reference.shape[1] * 4 + 8  # a row and its version in the reply
    most = (MAX_MESSAGE - 4096) // row_bytes  # the largest reply under the limit
    errors: list[BaseException] = []

    def pulls(seed: int, clients: list) -> None:
        rng = np.random.default_rng(seed)
        client = target.sh.client(timeout_s=20)
        clients.append(client)
        try:
            for _ in range(int(40 * SCALE)):
                n = int(rng.integers(1, most)) if rng.random() < 0.7 else int(rng.integers(1, 64))
                ids = rng.choice(universe, size=min(n, universe.size), replace=False)
                got = client.pull("probe", ids, peek=True).rows
                np.testing.assert_array_equal(got, reference[ids])
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    clients: list = []
    threads = [threading.Thread(target=pulls, args=(s, clients)) for s in range(6)]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=50)
        assert not any(th.is_alive() for th in threads), "a puller did not finish within 50 s"
    finally:
        for c in clients:
            c.close()
    assert not errors, errors[0]
    target.check()
    with capsys.disabled():
        print(f"\n[fuzz] ps concurrent mixed-size pulls: 6 clients x {int(40 * SCALE)} in "
              f"{time.perf_counter() - t0:.1f} s")


OVERFLOW_IDS = np.arange(10_000, 10_012, dtype=np.int64)  # rows no other case pushes to
DIMS = {t.name: t.dim for t in TABLES}


def _refused_pushes(target: Target) -> int:
    return target.client.stats()[0]["refused_nonfinite_pushes"]


@_settings(60)
@given(table=st.sampled_from(["sgd", "adam", "agrad", "rwa"]), n=st.integers(1, 12),
       huge_row=st.integers(0, 11), sign=st.sampled_from([1.0, -1.0]),
       scale=st.sampled_from([1.0, 1e10, 1e19, 1e20, 1e30, 3e38, 3.4e38]))
def _overflow(target: Target, table: str, n: int, huge_row: int, sign: float, scale: float,
              outcomes: dict[str, int]) -> None:
    ids = OVERFLOW_IDS[:n]
    before = target.client.pull(table, ids, with_state=True)
    refused = _refused_pushes(target)
    g = np.random.default_rng(n).standard_normal((n, DIMS[table])).astype(np.float32) * 0.01
    g[huge_row % n] = np.float32(sign * scale)
    try:
        target.client.push(table, ids, g, 1 + target.cases)
        outcome = "applied"
    except PSError as e:
        assert "refused a push whose result would be NaN or infinite" in str(e), e
        assert f"table '{table}'" in str(e) and "nothing was applied" in str(e)
        outcome = "refused"
    target.cases += 1
    after = target.client.pull(table, ids, with_state=True)
    assert np.isfinite(after.rows).all()  # property: no push ever leaves a non-finite row
    if outcome == "refused":
        assert np.array_equal(after.rows, before.rows)
        assert np.array_equal(after.versions, before.versions)
        assert _refused_pushes(target) == refused + 1
    else:
        assert np.array_equal(after.versions, before.versions + 1)
        assert _refused_pushes(target) == refused
    outcomes[outcome] += 1


def test_pushes_whose_result_overflows_are_refused_whole(target, capsys):
    outcomes = {"applied": 0, "refused": 0}

    def body() -> None:
        _overflow(target, outcomes=outcomes)
        ids = np.array([20_000], dtype=np.int64)  # repeated 3e38 pushes drive SGD rows to -inf
        for step in range(1, 30):
            try:
                target.client.push("sgd", ids, np.full((1, 8), 3e38, np.float32), step)
            except PSError as e:
                assert "refused a push whose result would be NaN or infinite" in str(e)
                break
            target.cases += 1
        else:
            pytest.fail("29 pushes of 3e38 to an SGD row (lr 0.1) were all applied")
        assert np.isfinite(target.client.pull("sgd", ids, with_state=True).rows).all()
        assert outcomes["applied"] > 0 and outcomes["refused"] > 0, outcomes

    _run(capsys, target, "overflowing pushes", body)


BYTE_BUDGET = 24 << 20  # the byte-budget shard's --max-bytes


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:"))


@_settings(40)
@given(dim=st.one_of(st.integers(1, 64), st.sampled_from([512, 1024, 4096])),
       kind=st.sampled_from(["sgd", "adagrad", "rowwise_adagrad", "adam"]),
       which=st.integers(0, 1000), rows=st.integers(1, 200_000))
def _byte_budget(sh: EmbeddedShards, client, names: list[str], outcomes: dict[str, int],
                 dim: int, kind: str, which: int, rows: int) -> None:
    name = f"b{len(names)}"
    try:
        client.register([TableConfig(name, dim=dim, optimizer=OptimizerConfig(kind=kind), seed=2)])
        names.append(name)
        outcomes["registered"] += 1
    except PSError as e:
        assert "byte budget is full" in str(e) and "--max-bytes" in str(e), e
        outcomes["refused"] += 1
    if names:  # new rows in one of the tables (at most 4 MiB of reply)
        table = names[which % len(names)]
        dim_of = client.stats()[0]["tables"][f"default/{table}"]["dim"]
        n = min(rows, max(1, (4 << 20) // (4 * dim_of)))
        start = client.stats()[0]["tables"][f"default/{table}"]["rows"]
        try:
            client.pull(table, np.arange(start, start + n, dtype=np.int64))
            outcomes["grown"] += 1
        except PSError as e:
            assert "byte budget is full" in str(e) and "--max-bytes" in str(e), e
            outcomes["refused"] += 1
    st_ = client.stats()[0]
    assert st_["bytes_held"] <= BYTE_BUDGET
    assert sum(t["slab_bytes"] for t in st_["tables"].values()) <= BYTE_BUDGET
    assert sh.procs[0].poll() is None


def test_a_shard_stays_within_its_byte_budget(tmp_path, capsys):
    """Hostile but well-formed clients: wide tables registered, many new rows pulled. The
    shard's bytes stay within --max-bytes (by its own count, and by its resident memory)."""
    t0 = time.perf_counter()
    outcomes = {"registered": 0, "grown": 0, "refused": 0}
    sh = EmbeddedShards(1, [], tmp_path, max_bytes=BYTE_BUDGET)
    try:
        client = sh.client(timeout_s=20)
        # the PULL kernel loaded (or compiled, on a cold numba cache: LLVM's memory) before the
        # baseline, so that the bound is on the rows, not on the compiler
        client.register([TableConfig("warm", dim=1, seed=2)])
        client.pull("warm", np.arange(1, dtype=np.int64))
        rss0 = _rss(sh.procs[0].pid)
        names: list[str] = []
        _byte_budget(sh, client, names, outcomes)
        assert outcomes["refused"] > 0 and outcomes["grown"] > 0, outcomes
        assert _rss(sh.procs[0].pid) - rss0 < BYTE_BUDGET + (96 << 20)  # + scratch, replies
        client.close()
    finally:
        sh.close()
        with capsys.disabled():
            print(f"\n[fuzz] ps byte budget: {sum(outcomes.values())} requests in "
                  f"{time.perf_counter() - t0:.1f} s ({outcomes})")
    assert all(p.poll() is not None for p in sh.procs)
