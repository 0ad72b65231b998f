"""Fuzzing the PS wire protocol against a real `cosparse ps serve` process (issue 11, "the suites
that keep it fixed"): random bytes; frames with a valid header and hostile descriptors (huge,
zero and mismatched shapes, unknown dtypes, ranks, op codes and flags, bad table names); valid
messages truncated, cut short by a frame, or grown past their descriptors and past the shard's
message limit.

Property: the shard answers every message (a reply carrying the request id it could read, an
error for every malformed one) and keeps serving a legitimate client, checked with a real pull
after every batch of cases and at the end. Each test runs without and with HMAC: with a key, the
fuzzer opens a session and MACs its hostile frames, so they reach the parsing behind the MAC.

Bounded: hypothesis with a fixed number of derandomized examples (no example database), each
test well under 60 s on two cores. ``COSPARSE_FUZZ_SCALE=10`` runs ten times the examples. Each
test prints how many cases it ran.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from ps_raw import RawPeer

from cosparse.config import OptimizerConfig, TableConfig
from cosparse.ps import EmbeddedShards
from cosparse.ps import protocol as P
from cosparse.ps.errors import PSError

SCALE = float(os.environ.get("COSPARSE_FUZZ_SCALE", "1"))
MAX_MESSAGE = P.MIN_MESSAGE_LIMIT  # the shard's --max-message-bytes: oversized cases stay cheap
CHECK_EVERY = 25  # cases between two checks with a legitimate client
TABLES = [TableConfig("sgd", dim=8, optimizer=OptimizerConfig(kind="sgd", lr=0.1), seed=1),
          TableConfig("adam", dim=4, optimizer=OptimizerConfig(kind="adam", lr=0.01), seed=3),
          # (no name that a truncated "adam" or "sgd" would spell: those cases must stay errors)
          TableConfig("agrad", dim=4, optimizer=OptimizerConfig(kind="adagrad", lr=0.1), seed=4),
          TableConfig("rwa", dim=8, optimizer=OptimizerConfig(kind="rowwise_adagrad", lr=0.1),
                      seed=5),
          TableConfig("probe", dim=4, seed=9)]  # never named by the fuzzer: must stay unchanged
PROBE_IDS = np.arange(-20, 20, dtype=np.int64)


def _settings(examples: int) -> settings:
    # no shrinking: after a shard dies every case fails alike, and each would wait for its reply
    return settings(max_examples=max(1, int(examples * SCALE)), deadline=None, database=None,
                    derandomize=True, suppress_health_check=list(HealthCheck),
                    phases=[Phase.explicit, Phase.reuse, Phase.generate])


class Target:
    """A shard process, a raw fuzzing connection to it, and a legitimate client."""

    def __init__(self, tmp, key_file) -> None:
        self.key = key_file.read_bytes().strip() if key_file is not None else None
        self.sh = EmbeddedShards(1, TABLES, tmp, auth_key_file=key_file,
                                 extra_args=["--max-message-bytes", str(MAX_MESSAGE)])
        self.client = self.sh.client(timeout_s=20)
        self.probe = self.client.pull("probe", PROBE_IDS, with_state=True)
        self.raw = RawPeer(self.sh.endpoints[0], key=self.key, timeout_s=5)
        self.cases = 0

    def check(self) -> None:
        """The shard process is alive and a legitimate client gets the same probe rows."""
        assert self.sh.procs[0].poll() is None, "the shard process exited"
        got = self.client.pull("probe", PROBE_IDS, with_state=True)
        assert np.array_equal(got.rows, self.probe.rows)
        assert np.array_equal(got.versions, self.probe.versions)

    def answer(self, frames: list[bytes], expect_error: bool = True) -> P.Message:
        """Send one case; its reply (every case must get one)."""
        frames = self.raw.authenticate(frames)
        head = P.peek_header(frames)
        self.raw.send(frames)
        rep = self.raw.recv()
        if rep is None:
            rc = self.sh.procs[0].poll()
            state = "running" if rc is None else f"exited with code {rc}: {self.sh._log_tail(0)}"
            pytest.fail(f"no reply within 5 s to {[f[:64] for f in frames]} (shard {state})")
        assert rep.flags & P.FLAG_REPLY
        assert rep.request_id == (head[2] if head is not None else 0)
        if expect_error:
            assert rep.error != P.E_OK, (rep, [f[:64] for f in frames])
        if rep.error != P.E_OK:
            assert rep.error in P.ERROR_NAMES and rep.text, rep
        self.cases += 1
        if self.cases % CHECK_EVERY == 0:
            self.check()
        return rep

    def close(self) -> None:
        try:
            self.raw.close()
            self.client.close()
        finally:
            self.sh.close()


@pytest.fixture(scope="module", params=["plain", "hmac"])
def target(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"fuzz-{request.param}")
    key_file = None
    if request.param == "hmac":
        key_file = tmp / "hmac.key"
        key_file.write_bytes(os.urandom(32).hex().encode())
    t = Target(tmp / "ps", key_file)
    try:
        yield t
    finally:
        t.close()
    assert all(p.poll() is not None for p in t.sh.procs)


def _run(capsys, target: Target, name: str, body) -> None:
    t0, before = time.perf_counter(), target.cases
    try:
        body()
        target.check()
    finally:
        with capsys.disabled():
            print(f"\n[fuzz] ps {name} ({'hmac' if target.key else 'plain'}): "
                  f"{target.cases - before} cases in {time.perf_counter() - t0:.1f} s")


# --- strategies ---------------------------------------------------------------------------------
U64_EDGES = [0, 1, 2, 3, 7, 8, 2**31 - 1, 2**31, 2**32, 2**32 + 1, 2**33, 2**40, 2**60, 2**62,
             2**63 - 1, 2**63, 2**64 - 1]
huge = st.one_of(st.sampled_from(U64_EDGES[6:]), st.integers(2**31, 2**64 - 1))
dims = st.one_of(st.sampled_from(U64_EDGES), st.integers(0, 2**64 - 1), st.integers(0, 64))
shapes = st.one_of(  # (rows, width): a zero beside a huge one, huge ones, anything, small ones
    st.tuples(huge, st.just(0)), st.tuples(st.just(0), huge), st.tuples(huge, huge),
    st.tuples(dims, dims), st.tuples(st.integers(0, 64), st.integers(0, 64)))
op_codes = st.one_of(st.sampled_from(sorted(P.OP_NAMES)), st.integers(0, 255))
known_flags = P.KNOWN_FLAGS & ~P.FLAG_HMAC  # the peer sets HMAC itself
flag_bits = st.one_of(st.integers(0, known_flags).map(lambda f: f & known_flags),
                      st.integers(0, 0xFFFF).map(lambda f: f & ~P.FLAG_HMAC))
texts = st.one_of(
    st.sampled_from([b"sgd", b"adam", b"", b"nope", b"../../etc", b"sgd\x00", b"x" * 200,
                     b"\xff\xfe", b"[]", b"[{}]", b'[{"name": "w", "dim": 1000000}]',
                     b'[{"name": "w", "dim": -1}]', b'[{"name": "sgd", "dim": 9}]',
                     b'[{"name": "q", "seed": 99999999999999999999999}]']),
    st.binary(max_size=64))


@st.composite
def hostile_messages(draw) -> list[bytes]:
    """A valid magic and version, then anything: op, flags, array count and descriptors, frames
    whose sizes may or may not match them (mostly consistent, so most cases reach the deepest
    checks: the descriptors' shapes, then the shard's own)."""
    n = draw(st.integers(0, P.MAX_ARRAYS + 2))
    descs, bodies = [], []
    for _ in range(n):
        code = draw(st.one_of(st.sampled_from(sorted(P.DTYPES)), st.integers(0, 255)))
        ndim = draw(st.sampled_from([1, 2, 2, 0, 3, 255]))
        s0, s1 = draw(shapes)
        if ndim == 1:
            s1 = draw(st.sampled_from([0, 0, 0, 1, 2**63]))
        descs.append(P.DESC.pack(code, ndim, s0, s1))
        itemsize = P.DTYPES[code].itemsize if code in P.DTYPES else 1
        want = s0 * (s1 if ndim == 2 else 1) * itemsize
        size = min(4096, draw(st.sampled_from([want, want, want, want + 1, max(want - 1, 0), 3])))
        bodies.append(draw(st.binary(min_size=size, max_size=size)) if draw(st.booleans())
                      else bytes(size))
    n_field = draw(st.sampled_from([n, n, n, n, 0xFFFF, n + 1]))
    head = P.HEADER.pack(P.MAGIC, P.VERSION, draw(op_codes), draw(flag_bits),
                         draw(st.integers(0, 2**64 - 1)), draw(st.integers(-(2**63), 2**63 - 1)),
                         draw(st.integers(0, 0xFFFF)), n_field, draw(st.integers(0, 2**32 - 1)))
    frames = [head + b"".join(descs), draw(texts), *bodies]
    cut = draw(st.sampled_from([0, 0, 0, 1, 2]))  # sometimes a frame too few or too many
    if cut == 1 and len(frames) > 1:
        frames = frames[:-1]
    elif cut == 2:
        frames.append(draw(st.binary(max_size=32)))
    return frames


def _valid_messages() -> list[P.Message]:
    ids = np.arange(40, dtype=np.int64)
    return [
        P.Message(P.OP_PULL, text="sgd", arrays=[ids]),
        P.Message(P.OP_PULL, flags=P.FLAG_WITH_STATE | P.FLAG_PEEK, text="adam", arrays=[ids]),
        P.Message(P.OP_PUSH, arg=1, text="sgd", arrays=[ids, np.ones((40, 8), np.float32)]),
        P.Message(P.OP_PUSH_ROWS, text="adam", arrays=[ids, np.ones((40, 9), np.float32)]),
        P.Message(P.OP_REGISTER, text='[{"name": "sgd", "dim": 8, "seed": 1}]'),
        P.Message(P.OP_STATS),
        P.Message(P.OP_PING),
    ]


VALID = [[bytes(f) for f in P.encode(m)] for m in _valid_messages()]


# --- the tests ----------------------------------------------------------------------------------
@_settings(500)
@given(frames=st.lists(st.binary(max_size=300), min_size=1, max_size=6))
def _random_bytes(target: Target, frames: list[bytes]) -> None:
    if len(frames[0]) >= 4 and frames[0][:4] == P.MAGIC:
        frames[0] = b"JUNK" + frames[0][4:]
    target.answer(frames)


def test_random_bytes_get_error_replies(target, capsys):
    _run(capsys, target, "random bytes", lambda: _random_bytes(target))


@_settings(1500)
@given(frames=hostile_messages())
def _hostile(target: Target, frames: list[bytes]) -> None:
    target.answer(frames, expect_error=False)  # a few are valid by chance: any reply will do


def test_hostile_headers_and_descriptors_are_answered(target, capsys):
    _run(capsys, target, "hostile descriptors", lambda: _hostile(target))


@_settings(400)
@given(which=st.integers(0, len(VALID) - 1), frame=st.integers(0, 8), drop=st.booleans(),
       keep=st.floats(0, 1, exclude_max=True))
def _truncated(target: Target, which: int, frame: int, drop: bool, keep: float) -> None:
    frames = list(VALID[which])
    i = frame % len(frames)
    if drop or not frames[i]:  # a frame too few
        frames.pop(i)
    else:  # a frame cut short
        frames[i] = frames[i][: int(keep * len(frames[i]))]
    target.answer(frames)


def test_truncated_messages_get_error_replies(target, capsys):
    _run(capsys, target, "truncated", lambda: _truncated(target))


@_settings(200)
@given(which=st.integers(0, len(VALID) - 1), frame=st.integers(0, 8),
       extra=st.sampled_from([1, 7, 8, 4096, MAX_MESSAGE // 2]), over=st.booleans())
def _oversized(target: Target, which: int, frame: int, extra: int, over: bool) -> None:
    frames = list(VALID[which])
    i = frame % len(frames)
    if over:  # every frame under the per-frame limit, the message over the shard's limit
        frames = [*frames, *[b"\0" * (MAX_MESSAGE // 2)] * 3]
    else:  # one frame longer than its descriptor (or the header, or the text limit) allows
        frames[i] = frames[i] + b"\x01" * extra
    # (STATS and PING read no text: a longer one, under the text limit, is still valid)
    ignored = i == 1 and not over and frames[0][5] in (P.OP_STATS, P.OP_PING) \
        and len(frames[1]) <= P.MAX_TEXT
    rep = target.answer(frames, expect_error=not ignored)
    if over:
        assert rep.error == P.E_LIMIT and "--max-message-bytes" in rep.text, rep


def test_oversized_messages_get_error_replies(target, capsys):
    _run(capsys, target, "oversized", lambda: _oversized(target))


def test_a_frame_over_the_transport_limit_drops_only_that_connection(target, capsys):
    t0 = time.perf_counter()
    for size in (MAX_MESSAGE + 1, 4 * MAX_MESSAGE):
        with RawPeer(target.sh.endpoints[0], key=target.key, timeout_s=1.5) as big:
            big.send(big.authenticate([b"\0" * size]))
            assert big.recv() is None  # cut unread by ZeroMQ (MAXMSGSIZE): nothing to answer
        target.check()
        assert target.answer([b"JUNK"]).error == P.E_BAD_FRAME  # the fuzz connection still works
    with capsys.disabled():
        print(f"\n[fuzz] ps over the transport limit: 2 cases in {time.perf_counter() - t0:.1f} s")


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
