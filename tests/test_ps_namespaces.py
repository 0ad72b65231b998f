"""Many models on one PS, with real `cosparse ps serve` processes: namespaces keep same-named
tables apart, ``shared_as`` shares one on purpose (a mismatch refused naming both sides), quotas
refuse what does not fit (nothing applied) and the shards account every request per namespace,
and snapshots and REGISTER requests from before namespaces load into ``default``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from cosparse.config import ConfigError, OptimizerConfig, TableConfig, config_from_mapping
from cosparse.ps import EmbeddedShards, PSClient, PSError
from cosparse.ps import protocol as P
from cosparse.ps.shard import Shard

USER = TableConfig("user", dim=8, optimizer=OptimizerConfig(kind="sgd", lr=0.1), seed=1)


@pytest.fixture()
def shards(tmp_path):
    sh = EmbeddedShards(2, [USER], tmp_path / "ps", namespace="a")
    try:
        yield sh
    finally:
        sh.close()


def _client(sh: EmbeddedShards, namespace: str, quota: dict | None = None) -> PSClient:
    return PSClient(sh.endpoints, timeout_s=20, watch=sh.check, namespace=namespace, quota=quota)


def test_same_named_tables_of_two_namespaces_never_share_rows(shards):
    ids = np.arange(200, dtype=np.int64)
    with _client(shards, "a") as a, _client(shards, "b") as b, _client(shards, "default") as d:
        b.register([USER])
        d.register([USER])
        before = b.pull("user", ids).rows
        a.push("user", ids, np.ones((200, 8), np.float32), step=1)
        got_a, got_b, got_d = a.pull("user", ids), b.pull("user", ids), d.pull("user", ids)
        assert (got_a.versions == 1).all() and np.allclose(got_a.rows, before - 0.1)
        for other in (got_b, got_d):  # untouched: initial rows, never written
            assert (other.versions == 0).all()
            np.testing.assert_array_equal(other.rows, before)
        # a bare name (an older client) is the default namespace's table
        np.testing.assert_array_equal(d.pull("default/user", ids).rows, before)
        st = a.stats()
        for s in st:
            assert {"a/user", "b/user", "default/user"} <= set(s["tables"])
        assert sum(s["namespaces"]["a"]["rows"] for s in st) == 200


def test_shared_as_shares_the_rows_and_a_mismatch_is_refused_naming_both_sides(shards):
    ids = np.arange(100, dtype=np.int64)
    shared = dataclasses.replace(USER, name="u", shared_as="a/user")
    with _client(shards, "a") as a, _client(shards, "b") as b:
        b.register([shared])
        b.push(shared.remote_name, ids, np.ones((100, 8), np.float32), step=1)
        a.push("user", ids, np.ones((100, 8), np.float32), step=2)
        got_a, got_b = a.pull("user", ids), b.pull(shared.remote_name, ids)
        assert (got_a.versions == 2).all()
        np.testing.assert_array_equal(got_a.rows, got_b.rows)
        assert "b/u" not in a.stats()[0]["tables"]  # no table of its own in b
        bad = dataclasses.replace(shared, dim=4)
        with pytest.raises(PSError, match=r"table 'a/user' is already registered, by namespace "
                                          r"'a'.*namespace 'b' asks.*shared_as: a/user.*dim 8 vs 4"):
            b.register([bad])
        lr = dataclasses.replace(shared, optimizer=OptimizerConfig(kind="sgd", lr=0.5))
        with pytest.raises(PSError, match=r"optimizer.lr 0.1 vs 0.5"):
            b.register([lr])


def test_quota_refuses_new_rows_over_it_applies_nothing_and_requests_are_accounted(tmp_path):
    with EmbeddedShards(1, [], tmp_path / "ps") as sh, \
            _client(sh, "q", quota={"rows": 100}) as q, \
            _client(sh, "r", quota={"bytes": 10 * 8 * 4}) as r:
        q.register([USER])
        r.register([USER])
        q.pull("user", np.arange(100, dtype=np.int64))
        with pytest.raises(PSError, match=r"namespace 'q' is at its quota on shard 0: it holds "
                                          r"100 rows.*quota of 100 rows.*nothing was applied.*"
                                          r"store.remote.quota"):
            q.pull("user", np.arange(90, 110, dtype=np.int64))  # 90 held + 10 new
        r.pull("user", np.arange(10, dtype=np.int64))
        with pytest.raises(PSError, match=r"namespace 'r'.*quota of 320 bytes"):
            r.pull("user", np.arange(5, 15, dtype=np.int64))
        r.pull("user", np.arange(10, dtype=np.int64))  # rows it holds: still fine
        ns = q.stats()[0]["namespaces"]
        assert (ns["q"]["rows"], ns["r"]["rows"]) == (100, 10)  # nothing half-applied
        assert ns["q"]["quota"] == {"rows": 100, "bytes": None}
        assert ns["r"]["bytes"] == 10 * 8 * 4
        pull = ns["q"]["ops"]["PULL"]
        # ids (8 bytes) out; rows (8 floats) and versions (8 bytes) back
        assert pull == {"requests": 1, "rows": 100, "bytes": 100 * (8 + 32 + 8), "refused": 1}
        assert ns["r"]["ops"]["PULL"] == {"requests": 2, "rows": 20, "bytes": 20 * 48,
                                          "refused": 1}
        # a quota lives inside the shard's row budget
        with _client(sh, "z", quota={"rows": 1 << 40}) as z, \
                pytest.raises(PSError, match=r"over the shard's row budget.*--max-rows"):
            z.register([USER])


def test_an_old_snapshot_and_an_old_register_load_into_default(tmp_path):
    # a snapshot as written before namespaces: tables keyed by their bare name
    old = Shard(0, 1)
    old.register([USER])
    ids = np.arange(50, dtype=np.int64)
    old.push("user", ids, np.ones((50, 8), np.float32), step=1)
    want, _, _ = old.pull("user", ids)
    root = tmp_path / "ps" / "shard-0"
    name = old.snapshot(root)
    mpath = root / "snapshots" / name / "manifest.json"
    m = json.loads(mpath.read_text())
    m["tables"] = {k.split("/")[1]: {f: v for f, v in tm.items()
                                     if f not in ("namespace", "registered_by")}
                   for k, tm in m["tables"].items()}
    assert list(m["tables"]) == ["user"]
    mpath.write_text(json.dumps(m))
    with EmbeddedShards(1, [], tmp_path / "ps") as sh, _client(sh, "default") as c:
        got = c.pull("user", ids)
        np.testing.assert_array_equal(got.rows, want)
        assert (got.versions == 1).all()
        assert list(c.stats()[0]["tables"]) == ["default/user"]
        # an old client's PULL: a bare table name, in default
        (rep,) = c._call([(0, P.Message(P.OP_PULL, text="user", arrays=[ids]))])
        np.testing.assert_array_equal(rep.arrays[0], want)
        # an old client's REGISTER: a bare JSON list, into default
        doc = {**dataclasses.asdict(dataclasses.replace(USER, name="item"))}
        c._call_all(lambda: P.Message(P.OP_REGISTER, text=json.dumps([doc])))
        assert "default/item" in c.stats()[0]["tables"]


def _remote_cfg(**remote) -> dict:
    return {"data": {"reader": "synthetic"}, "supply": {"path": "ps-direct"},
            "tables": [{"name": "t", "features": ["f"]}],
            "store": {"remote": {"embedded": False, "endpoints": ["127.0.0.1:1"], **remote}}}


@pytest.mark.parametrize("remote,match", [
    ({"namespace": "a/b"}, r"store.remote.namespace: 'a/b' is not a valid namespace"),
    ({"quota": {}}, r"store.remote.quota: give rows, bytes or both"),
    ({"quota": {"rows": 0}}, r"store.remote.quota.rows: must be positive"),
    ({"quota": {"bytes": "0MB"}}, r"store.remote.quota.bytes: must be positive"),
    ({"quota": {"rows": 10}, "max_rows": 5}, r"store.remote.quota.rows: 10 is over"),
])
def test_namespace_and_quota_config_refusals_name_the_key(remote, match):
    with pytest.raises(ConfigError, match=match):
        config_from_mapping(_remote_cfg(**remote))


def test_shared_as_config_refusal_names_the_key():
    raw = _remote_cfg()
    raw["tables"][0]["shared_as"] = "no_slash"
    with pytest.raises(ConfigError, match=r"tables\[0\].shared_as: 'no_slash' is not "
                                          r"NAMESPACE/TABLE"):
        config_from_mapping(raw)
    raw["tables"][0]["shared_as"] = "ctr/user"
    assert config_from_mapping(raw).tables[0].remote_name == "ctr/user"


def test_a_snapshot_with_namespaces_restores_them(tmp_path: Path):
    s = Shard(0, 1)
    s.register([USER], "m1")
    s.register([USER], "m2")
    s.push("m1/user", np.arange(5, dtype=np.int64), np.ones((5, 8), np.float32), step=1)
    s.snapshot(tmp_path)
    back = Shard(0, 1)
    back.restore(tmp_path)
    assert sorted(back.tables) == ["m1/user", "m2/user"]
    assert back.tables["m1/user"].rows == 5 and back.tables["m2/user"].rows == 0


def test_a_trainer_over_its_quota_stops_naming_the_namespace_and_the_key():
    """store.remote.quota reaches the shards with the run's REGISTER (architecture A)."""
    from exactness import base_config, ps_direct, run

    from cosparse.config import QuotaConfig

    cfg = ps_direct(base_config("zipf", "sgd"), num_shards=2, lookahead=1)
    cfg.store.remote.namespace = "ctr"
    cfg.store.remote.quota = QuotaConfig(rows=50)
    with pytest.raises(Exception, match=r"namespace 'ctr' is at its quota on shard \d: .*quota "
                                        r"of 50 rows.*store.remote.quota"):
        run(cfg)
