"""Wire protocol (in-process): round trips, strict validation, HMAC, and shard ownership."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from cosparse.ps import protocol as P
from cosparse.store import kernels


def test_round_trip_is_zero_copy_and_exact():
    ids = np.array([1, -5, 2**62], dtype=np.int64)
    rows = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    msg = P.Message(P.OP_PUSH, request_id=77, arg=12, text="table", arrays=[ids, rows])
    got = P.decode([bytes(f) for f in P.encode(msg)])
    assert (got.op, got.request_id, got.arg, got.text) == (P.OP_PUSH, 77, 12, "table")
    assert np.array_equal(got.arrays[0], ids) and np.array_equal(got.arrays[1], rows)
    assert not got.arrays[1].flags.writeable  # a view of the received buffer, no copy


@pytest.mark.parametrize("mutate, code", [
    (lambda f: [f[0][:10]], P.E_BAD_FRAME),
    (lambda f: [b"NOPE" + f[0][4:], *f[1:]], P.E_BAD_FRAME),
    (lambda f: [f[0][:4] + b"\x09" + f[0][5:], *f[1:]], P.E_BAD_VERSION),
    (lambda f: f[:-1], P.E_BAD_FRAME),
    (lambda f: [f[0], f[1], f[2][:-1]], P.E_BAD_FRAME),
    (lambda f: [f[0][:P.HEADER.size] + b"\x63" + f[0][P.HEADER.size + 1:], *f[1:]], P.E_BAD_DTYPE),
    (lambda f: [f[0][:5] + b"\xee" + f[0][6:], *f[1:]], P.E_UNKNOWN_OP),
    (lambda f: [f[0], b"\xff\xfe", f[2]], P.E_BAD_FRAME),
])
def test_malformed_messages_raise_protocol_errors(mutate, code):
    frames = [bytes(x) for x in P.encode(P.Message(P.OP_PULL, text="t", arrays=[np.arange(4)]))]
    with pytest.raises(P.ProtocolError) as ei:
        P.decode(mutate(frames))
    assert ei.value.code == code


def test_hmac_rejects_missing_wrong_and_tampered():
    key = b"k" * 32
    frames = [bytes(x) for x in P.encode(P.Message(P.OP_PULL, text="t", arrays=[np.arange(4)]), key)]
    assert P.decode(frames, key).text == "t"
    for bad in ([bytes(x) for x in P.encode(P.Message(P.OP_PULL, text="t", arrays=[np.arange(4)]))],
                [frames[0], frames[1], np.arange(1, 5).tobytes(), frames[3]]):
        with pytest.raises(P.ProtocolError) as ei:
            P.decode(bad, key)
        assert ei.value.code in (P.E_AUTH, P.E_BAD_FRAME)
    with pytest.raises(P.ProtocolError) as ei:
        P.decode(frames, b"x" * 32)
    assert ei.value.code == P.E_AUTH


@numba.njit
def _mix_all(ids, out):
    for i in range(ids.shape[0]):
        out[i] = kernels.mix64(np.uint64(ids[i]))


def test_shard_of_uses_the_engine_mix64():
    ids = np.random.default_rng(1).integers(-(2**63), 2**63 - 1, size=1000, dtype=np.int64)
    ref = np.empty(1000, dtype=np.uint64)
    _mix_all(ids, ref)
    assert np.array_equal(P.mix64(ids), ref)
    owner = P.shard_of(ids, 3)
    assert np.array_equal(owner, (ref % np.uint64(3)).astype(np.int64))
    assert set(np.unique(owner).tolist()) == {0, 1, 2}


def hostile_pull(dtype_code: int, ndim: int, s0: int, s1: int, body: bytes = b"",
                 text: bytes = b"sgd") -> list[bytes]:
    """A PULL whose one array descriptor says whatever it is told (issue 11, defect 2)."""
    head = P.HEADER.pack(P.MAGIC, P.VERSION, P.OP_PULL, 0, 5, 0, 0, 1, 0)
    return [head + P.DESC.pack(dtype_code, ndim, s0, s1), text, body]


@pytest.mark.parametrize("desc", [
    (2, 2, 2**60, 0),  # the 59-byte message of the issue: int64, shape (2^60, 0)
    (6, 2, 2**63, 0),  # over numpy's largest dimension
    (1, 2, 0, 2**62),
    (6, 2, 2**64 - 1, 0),
    (2, 1, 2**60, 0),  # 1-D, and no bytes for it
])
def test_hostile_shapes_are_protocol_errors_not_crashes(desc):
    frames = hostile_pull(*desc)
    if desc[:4] == (2, 2, 2**60, 0):
        assert sum(len(f) for f in frames) == 59
    with pytest.raises(P.ProtocolError) as ei:
        P.decode(frames)
    assert ei.value.code == P.E_BAD_FRAME and ei.value.request_id == 5


def test_hmac_covers_the_session_nonce():
    key, s1, s2 = b"k" * 32, b"a" * P.NONCE_BYTES, b"b" * P.NONCE_BYTES
    msg = P.Message(P.OP_PUSH, request_id=3, arg=1, text="t",
                    arrays=[np.arange(2), np.zeros((2, 4), np.float32)])
    frames = [bytes(f) for f in P.encode(msg, key, s1)]
    assert P.decode(frames, key, s1).request_id == 3
    for other in (s2, b""):  # another connection's session, or none
        with pytest.raises(P.ProtocolError) as ei:
            P.decode(frames, key, other)
        assert ei.value.code == P.E_AUTH
    with pytest.raises(P.ProtocolError) as ei:  # an oversized MAC frame is refused unread
        P.decode([*frames[:-1], b"\0" * (1 << 20)], key, s1)
    assert ei.value.code == P.E_AUTH
