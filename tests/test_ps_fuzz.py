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

import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from ps_fuzz_target import MAX_MESSAGE, Target, _run, _settings, serve_target
from ps_raw import RawPeer

from cosparse.ps import protocol as P


@pytest.fixture(scope="module", params=["plain", "hmac"])
def target(request, tmp_path_factory):
    yield from serve_target(request.param, tmp_path_factory)


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
