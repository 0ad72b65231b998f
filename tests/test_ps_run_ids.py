"""Run IDs and CLEAR on a real ``cosparse ps serve`` shard with ``--namespaces`` (issue 32, items
1 and 2): a snapshot records the run of each namespace's rows and a restart restores them; CLEAR
(``cosparse train --fresh`` on external shards) is authenticated like every request and drops the
caller's namespace's tables only, and the snapshot after it does not bring them back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cosparse.config import OptimizerConfig, TableConfig
from cosparse.ps import PSAccessDenied, PSAuthError, PSClient, PSError
from cosparse.ps import protocol as P

CAT = TableConfig("cat", dim=4, optimizer=OptimizerConfig(kind="sgd", lr=0.1), seed=1)


def _serve(root: Path) -> tuple[subprocess.Popen, str]:
    ready = root / "ready"
    ready.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "cosparse.cli", "ps", "serve", "--shard", "0",
                             "--num-shards", "1", "--data-dir", str(root / "d"),
                             "--namespaces", str(root / "ns.yaml"), "--ready-file", str(ready),
                             "--parent-pid", str(os.getpid())],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), f"shard did not start: {proc.poll()}"
    return proc, ready.read_text().strip()


def _stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(10)


@pytest.fixture()
def root(tmp_path):
    (tmp_path / "keys").mkdir()
    for ns in ("m1", "m2"):
        (tmp_path / "keys" / f"{ns}.key").write_bytes(os.urandom(32).hex().encode())
    (tmp_path / "ns.yaml").write_text("m1: {key: keys/m1.key}\nm2: {key: keys/m2.key}\n")
    return tmp_path


def test_clear_drops_the_callers_namespace_only_and_run_ids_survive_a_restart(root):
    def client(ns: str, endpoint: str, key_of: str | None = None) -> PSClient:
        return PSClient([endpoint], timeout_s=10, auth_key=root / "keys" / f"{key_of or ns}.key",
                        namespace=ns)

    ids = np.arange(50, dtype=np.int64)
    proc, ep = _serve(root)
    try:
        with client("m1", ep) as m1, client("m2", ep) as m2:
            for c in (m1, m2):
                c.register([CAT])
                c.push("cat", ids, np.ones((50, 4), np.float32), step=1)
            m1_rows = m1.pull("cat", ids).rows
            m1.snapshot(run_id="run-one")
            names = m2.snapshot(incremental=True, run_id="run-two")
            assert m1.stats()[0]["run_ids"] == {"m1": "run-one"}  # its own only
            with pytest.raises(PSAccessDenied, match="clears only its own tables"):
                m2._call_all(lambda: P.Message(P.OP_CLEAR, text="m1"))
            with pytest.raises(PSAccessDenied, match="names only its own run"):
                m2._call_all(lambda: P.Message(P.OP_SNAPSHOT, arrays=[np.frombuffer(
                    json.dumps({"namespace": "m1", "run_id": "x"}).encode(), np.uint8)]))
        with client("m1", ep, key_of="m2") as forged, pytest.raises(PSAuthError):
            forged.clear()  # CLEAR is authenticated like every request
        manifest = json.loads((root / "d" / "snapshots" / names[0] / "manifest.json").read_text())
        assert manifest["run_ids"] == {"m1": "run-one", "m2": "run-two"}
        with client("m2", ep) as m2:
            assert m2.clear() == [{"namespace": "m2", "tables": ["m2/cat"], "rows": 50}]
            assert m2.stats()[0]["run_ids"] == {}
            m2.snapshot(incremental=True)  # full: an incremental one would restore m2/cat
        _stop(proc)
        proc, ep = _serve(root)  # restores the newest snapshot
        with client("m1", ep) as m1, client("m2", ep) as m2:
            np.testing.assert_array_equal(m1.pull("cat", ids).rows, m1_rows)
            assert m1.stats()[0]["run_ids"] == {"m1": "run-one"}
            assert set(m1.stats()[0]["tables"]) == {"m1/cat"}
            with pytest.raises(PSError, match="unknown table 'm2/cat'"):
                m2.pull("cat", ids)
    finally:
        _stop(proc)
