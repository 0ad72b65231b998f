"""Namespaces as the unit of trust (issue 31, items 2 and 8), with real `cosparse ps serve`
processes: with ``--namespaces FILE`` each namespace authenticates with its own key, touches only
its own tables, reads another's only as a listed reader, and gets its quota from the operator's
file only; the refusals say what was refused and where it is set. Also: a deeply nested
REGISTER, and an over-size request in HMAC mode, get replies the client can report."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from ps_raw import RawPeer

from cosparse import exits
from cosparse.config import OptimizerConfig, TableConfig
from cosparse.ps import EmbeddedShards, PSAccessDenied, PSAuthError, PSClient, PSError, PSFull
from cosparse.ps import protocol as P
from cosparse.ps.register_request import json_depth
from cosparse.ps.tenancy import Tenancy

CAT = TableConfig("cat", dim=8, optimizer=OptimizerConfig(kind="sgd", lr=0.1), seed=1)
NAMESPACES = """
m1: {key: keys/m1.key, quota: {rows: 300}, readers: [m2]}
m2: {key: keys/m2.key}
m3: {key: keys/m3.key}
"""


@pytest.fixture()
def tenants(tmp_path):
    """One shard with ``--namespaces``: m1 (quota 300 rows; m2 may read it), m2 and m3."""
    (tmp_path / "keys").mkdir()
    for ns in ("m1", "m2", "m3"):
        (tmp_path / "keys" / f"{ns}.key").write_bytes(os.urandom(32).hex().encode())
    (tmp_path / "ns.yaml").write_text(NAMESPACES)
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-m", "cosparse.cli", "ps", "serve", "--shard", "0",
                             "--num-shards", "1", "--data-dir", str(tmp_path / "d"),
                             "--namespaces", str(tmp_path / "ns.yaml"), "--ready-file", str(ready),
                             "--parent-pid", str(os.getpid())],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), f"shard did not start: {proc.poll()} {proc.stderr.read()}"
        endpoint = ready.read_text().strip()

        def client(ns: str, key_of: str | None = None, **kw) -> PSClient:
            key = tmp_path / "keys" / f"{key_of or ns}.key"
            return PSClient([endpoint], timeout_s=10, auth_key=key, namespace=ns, **kw)

        yield client, endpoint, tmp_path
    finally:
        proc.kill()
        proc.wait(10)
        proc.stderr.close()


def test_a_namespace_cannot_read_or_write_another_ones_table(tenants):
    """The issue's reproduction: a second model zeroed 100 of the first model's rows."""
    client, _, _ = tenants
    ids = np.arange(100, dtype=np.int64)
    with client("m1") as m1, client("m3") as m3:
        m1.register([CAT])
        m1.push("cat", ids, np.ones((100, 8), np.float32), step=1)
        before = m1.pull("cat", ids, with_state=True)
        m3.register([CAT])  # its own m3/cat: fine
        zeros = np.zeros((100, 8), np.float32)
        with pytest.raises(PSAccessDenied, match=r"namespace 'm3' may not write table 'm1/cat' of "
                                                 r"namespace 'm1'") as ei:
            m3.push_rows("m1/cat", ids, zeros)
        assert ei.value.code == P.E_DENIED
        with pytest.raises(PSAccessDenied, match=r"'m3' may not write table 'm1/cat'"):
            m3.push("m1/cat", ids, zeros, step=2)
        for read in (lambda: m3.pull("m1/cat", ids), lambda: m3.dump("m1/cat")):
            with pytest.raises(PSAccessDenied, match=r"namespace 'm3' may not read table 'm1/cat':"
                                                     r" namespace 'm1' does not list it in its "
                                                     r"readers \('m1.readers' in .*ns.yaml"):
                read()
        after = m1.pull("cat", ids, with_state=True)
        np.testing.assert_array_equal(after.rows, before.rows)  # nothing was applied
        np.testing.assert_array_equal(after.versions, before.versions)
        # STATS: its own namespace and tables only (and the shard's totals)
        st = m3.stats()[0]
        assert set(st["tables"]) == {"m3/cat"} and set(st["namespaces"]) <= {"m3"}
        assert "m1" in m1.stats()[0]["namespaces"]
    # another namespace's key, or a namespace not in the file: the HELLO fails
    with client("m1", key_of="m3") as bad, pytest.raises(PSAuthError, match="HMAC does not match"):
        bad.pull("cat", ids)
    with client("zz", key_of="m3") as bad, \
            pytest.raises(PSAuthError, match=r"'zz' may not connect: it is not in this shard's "
                                             r"namespaces file"):
        bad.ping()


def test_quotas_come_from_the_operators_file_only(tenants, capsys):
    client, _, tmp_path = tenants
    with client("m1") as m1, client("m2") as m2:
        m1.register([CAT])
        # another tenant's REGISTER cannot set m1's quota (the issue's {"namespace": "m1", ...})
        for doc in ({"namespace": "m1", "tables": [], "quota": {"rows": 1}},
                    {"namespace": "m2", "tables": [], "quota": {"rows": 1}}):
            with pytest.raises(PSAccessDenied):
                m2._call_all(lambda d=doc: P.Message(P.OP_REGISTER, text=json.dumps(d)))
        # ... nor can m1 clear or change its own
        with pytest.raises(PSAccessDenied, match=r"carries a quota: on this shard quotas are set "
                                                 r"by its operator \('m1.quota' in the namespaces "
                                                 r"file .*ns.yaml.*remove store.remote.quota"):
            m1._call_all(lambda: P.Message(P.OP_REGISTER, text=json.dumps(
                {"namespace": "m1", "tables": [], "quota": None})))
        with client("m1", quota={"rows": 10**6}) as greedy, pytest.raises(PSAccessDenied):
            greedy.register([CAT])
        assert m1.stats()[0]["namespaces"]["m1"]["quota"] == {"rows": 300, "bytes": None}
        # the file's quota holds: 300 rows fit, 10 more new ones do not (nothing applied)
        m1.pull("cat", np.arange(300, dtype=np.int64))
        with pytest.raises(PSFull) as ei:
            m1.pull("cat", np.arange(295, 310, dtype=np.int64))
        assert ei.value.code == P.E_QUOTA
        assert m1.stats()[0]["namespaces"]["m1"]["rows"] == 300
    # the trainer's one line names the namespace, its quota and where it is set, with exit 2
    capsys.readouterr()
    assert exits.report(ei.value) == exits.USAGE
    line = capsys.readouterr().err
    assert line.startswith("cosparse: PS namespace over its quota: ") and line.count("\n") == 1
    for part in ("namespace 'm1' is at its quota", "quota of 300 rows",
                 f"raise 'm1.quota' in the namespaces file {tmp_path / 'ns.yaml'}",
                 "--resume"):
        assert part in line, line


def test_shared_as_reads_only_for_listed_readers_and_never_writes(tenants):
    client, _, _ = tenants
    ids = np.arange(50, dtype=np.int64)
    shared = dataclasses.replace(CAT, name="c", shared_as="m1/cat")
    with client("m1") as m1, client("m2") as m2, client("m3") as m3:
        m1.register([CAT])
        m1.push("cat", ids, np.ones((50, 8), np.float32), step=1)
        m2.register([shared])  # m1 lists m2: a no-op on the table m1 registered
        got, own = m2.pull(shared.remote_name, ids), m1.pull("cat", ids)
        np.testing.assert_array_equal(got.rows, own.rows)
        assert (got.versions == 1).all()
        assert m2.dump("m1/cat")[0].shape == (50,)
        # a reader's pull creates nothing in m1's table (nor uses its quota)
        fresh = m2.pull("m1/cat", np.arange(1000, 1010, dtype=np.int64))
        assert (fresh.versions == -1).all()
        assert m1.stats()[0]["namespaces"]["m1"]["rows"] == 50
        assert "m1/cat" in m2.stats()[0]["tables"]
        for write in (lambda: m2.push("m1/cat", ids, np.ones((50, 8), np.float32), step=2),
                      lambda: m2.push_rows("m1/cat", ids, own.rows)):
            with pytest.raises(PSAccessDenied, match=r"namespace 'm2' may not write table "
                                                     r"'m1/cat' of namespace 'm1'"):
                write()
        with pytest.raises(PSAccessDenied, match=r"'m2' may not create table 'm1/dog' of "
                                                 r"namespace 'm1'"):
            m2.register([dataclasses.replace(shared, shared_as="m1/dog")])
        with pytest.raises(PSError, match=r"already registered, by namespace 'm1'.*namespace "
                                          r"'m2' asks.*dim 8 vs 4"):
            m2.register([dataclasses.replace(shared, dim=4)])
        with pytest.raises(PSAccessDenied, match=r"'m3' may not read table 'm1/cat'"):
            m3.register([shared])  # not a reader
        with pytest.raises(PSAccessDenied, match=r"SNAPSHOT 'm1.x': namespace 'm3' may name"):
            m3.snapshot("m1.x")
        m3.snapshot("m3.x")
        assert (m1.pull("cat", ids).versions == 1).all()  # never written by the others


@pytest.mark.parametrize("text, match", [
    ("m1: {quota: {rows: 1}}", r"ns.yaml: m1: expected .*key required"),
    ("m1: {key: keys/none.key}", r"ns.yaml: m1.key: .*none.key"),
    ("m1: {key: keys/m1.key, quota: {rows: 0}}", r"ns.yaml: m1.quota.rows: must be a positive"),
    ("m1: {key: keys/m1.key, quota: {rows: 99999}}", r"m1.quota.rows: 99999 is over the shard's "
                                                     r"row budget of 1000 rows \(ps serve "
                                                     r"--max-rows\)"),
    ("m1: {key: keys/m1.key, quota: {bytes: lots}}", r"m1.quota.bytes: cannot read 'lots'"),
    ("m1: {key: keys/m1.key, readers: [m9]}", r"m1.readers: 'm9' is not a namespace of this file"),
    ("m1: {key: keys/m1.key, owner: x}", r"ns.yaml: m1: expected"),
    ("a/b: {key: keys/m1.key}", r"'a/b' is not a valid namespace name"),
])
def test_a_bad_namespaces_file_is_refused_naming_the_file_and_key(tmp_path, text, match):
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "m1.key").write_bytes(os.urandom(32).hex().encode())
    (tmp_path / "ns.yaml").write_text(text)
    with pytest.raises(ValueError, match=match):
        Tenancy.load(tmp_path / "ns.yaml", max_rows=1000)


def test_ps_serve_exits_2_on_a_bad_namespaces_file(tmp_path):
    (tmp_path / "ns.yaml").write_text("m1: {key: missing.key}")
    r = subprocess.run([sys.executable, "-m", "cosparse.cli", "ps", "serve", "--shard", "0",
                        "--num-shards", "1", "--data-dir", str(tmp_path / "d"), "--namespaces",
                        str(tmp_path / "ns.yaml")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "ns.yaml: m1.key:" in r.stderr, r.stderr


# --- item 8: messages the operator can act on ----------------------------------------------
def test_a_deeply_nested_register_is_refused_with_a_message(tmp_path):
    assert json_depth('[{"a": "[[[[{{{"}]') == 2  # brackets in strings do not count
    with EmbeddedShards(1, [CAT], tmp_path) as sh, RawPeer(sh.endpoints[0]) as raw:
        for text in ("[" * 30000 + "]" * 30000, '{"tables": ' + "[" * 20 + "]" * 20 + "}"):
            rep = raw.request(P.Message(P.OP_REGISTER, text=text))
            assert rep.error == P.E_BAD_REQUEST and "REGISTER: JSON nested" in rep.text, rep
            assert "over the limit of 16" in rep.text
        assert raw.request(P.Message(P.OP_PING)).error == P.E_OK


def test_an_over_size_request_in_hmac_mode_gets_a_maced_limit_error(tmp_path):
    key_file = tmp_path / "hmac.key"
    key_file.write_bytes(os.urandom(32).hex().encode())
    wide = TableConfig("wide", dim=16, optimizer=OptimizerConfig(kind="sgd"))
    with EmbeddedShards(1, [wide], tmp_path / "ps", auth_key_file=key_file,
                        extra_args=["--max-message-bytes", str(2 << 20)]) as sh, \
            sh.client(timeout_s=10) as c:
        n = 32_000  # each frame under 2 MiB, the message over it
        c._limits[0] = (1 << 30, 1 << 20)  # as if the shard took more: the request is not split
        with pytest.raises(PSError, match=r"over a limit: message of \d+ bytes is over shard 0's "
                                          r"limit of 2097152.*--max-message-bytes") as ei:
            c.push_rows("wide", np.arange(n, dtype=np.int64), np.zeros((n, 16), np.float32))
        assert not isinstance(ei.value, PSAuthError)
        # a PULL whose reply would be over it (a fresh client: it does not know the width yet)
        with sh.client(timeout_s=10) as fresh, \
                pytest.raises(PSError, match=r"\d+-byte reply, over shard 0's limit") as ei:
            fresh.pull("wide", np.arange(40_000, dtype=np.int64), peek=True)
        assert not isinstance(ei.value, PSAuthError)
        assert c.pull("wide", np.arange(10, dtype=np.int64)).rows.shape == (10, 16)


def test_without_namespaces_the_shard_is_one_trust_domain(tmp_path: Path, capsys):
    """No ``--namespaces``: today's behaviour (what the README says): a client reaches every
    namespace's tables, and a REGISTER's quota applies to the namespace it names. Its refusal
    is reported as a quota (exit 2), not as an unavailable shard."""
    ids = np.arange(10, dtype=np.int64)
    with EmbeddedShards(1, [CAT], tmp_path, namespace="m1") as sh, sh.client() as m1, \
            PSClient(sh.endpoints, timeout_s=10, namespace="m2", quota={"rows": 5}) as m2:
        m2.register([CAT])
        m2.push_rows("m1/cat", ids, np.zeros((10, 8), np.float32))
        np.testing.assert_array_equal(m1.pull("cat", ids).rows, 0)
        assert m1.stats()[0]["namespaces"]["m2"]["quota"] == {"rows": 5, "bytes": None}
        with pytest.raises(PSError) as ei:
            m2.pull("cat", ids)
    capsys.readouterr()
    assert exits.report(ei.value) == exits.USAGE
    line = capsys.readouterr().err
    assert line.startswith("cosparse: PS namespace over its quota: ") and line.count("\n") == 1
    for part in ("namespace 'm2' is at its quota", "quota of 5 rows",
                 "raise store.remote.quota of namespace 'm2'"):
        assert part in line, line
