"""Issue 31 item 4: a PS restore trusts nothing it reads from a snapshot chain.

A manifest naming itself (or a 2-cycle) as its parent made ``ps serve`` grow to 3.7 GB and never
become ready; a snapshot whose NaN rows carried recomputed checksums was restored and the run
failed later with exit 8. Each is now a ``SnapshotError`` naming the snapshot (``ps serve``:
exit 2, at once): loops, chains past ``MAX_CHAIN_LENGTH``, files of another size than the
manifest records, checksum mismatches, and NaN or infinite rows or optimizer state.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cosparse.config import OptimizerConfig, TableConfig
from cosparse.ps import snapshot_format
from cosparse.ps.shard import Shard, SnapshotError
from cosparse.ps.snapshots import chain

CFG = TableConfig(name="t", dim=4, optimizer=OptimizerConfig(kind="adagrad", lr=0.1), seed=3)
IDS = np.arange(50, dtype=np.int64)


def _snapshots(root: Path, incrementals: int = 1) -> list[str]:
    """A full snapshot and ``incrementals`` over it, each after a push; their names, oldest first."""
    sh = Shard(0, 1)
    sh.register([CFG])
    names = []
    for step in range(1 + incrementals):
        sh.push("t", IDS[step::2], np.full((IDS[step::2].shape[0], 4), 0.1, np.float32), step + 1)
        names.append(sh.snapshot(root, incremental=step > 0))
    return names


def _manifest(root: Path, name: str) -> tuple[Path, dict]:
    p = root / "snapshots" / name / "manifest.json"
    return p, json.loads(p.read_text())


def _restore(root: Path) -> Shard:
    sh = Shard(0, 1)
    sh.restore(root)
    return sh


def test_a_sound_chain_restores_and_records_file_sizes(tmp_path):
    names = _snapshots(tmp_path, 2)
    sh = _restore(tmp_path)
    assert sh.last_snapshot == names[-1] and sh.table("t").rows == 50
    _, m = _manifest(tmp_path, names[0])
    tm = m["tables"]["default/t"]
    assert {f: (tmp_path / "snapshots" / names[0] / f).stat().st_size for f in tm["files"]} \
        == tm["sizes"]


def test_a_manifest_that_names_itself_as_parent_is_refused_at_once(tmp_path):
    names = _snapshots(tmp_path)
    p, m = _manifest(tmp_path, names[1])
    p.write_text(json.dumps({**m, "parent": names[1]}))
    t0 = time.perf_counter()
    with pytest.raises(SnapshotError, match=rf"chain of '{names[1]}' loops"):
        _restore(tmp_path)
    with pytest.raises(SnapshotError, match="loops"):  # pruning and export walk the same chain
        chain(tmp_path, names[1])
    assert time.perf_counter() - t0 < 2


def test_a_two_snapshot_cycle_is_refused(tmp_path):
    names = _snapshots(tmp_path, 2)  # full, incr A, incr B (B's parent: A)
    p, m = _manifest(tmp_path, names[1])
    p.write_text(json.dumps({**m, "parent": names[2]}))  # A's parent: B
    with pytest.raises(SnapshotError, match=rf"chain of '{names[2]}' loops"):
        _restore(tmp_path)  # from B (LATEST): B -> A -> B
    (tmp_path / "LATEST").write_text(names[1])
    with pytest.raises(SnapshotError, match=rf"names '{names[2]}' as its parent, which is not "
                                            "older"):
        _restore(tmp_path)  # from A: A -> B, a parent newer than its child


def test_a_chain_longer_than_the_bound_is_refused(tmp_path, monkeypatch):
    _snapshots(tmp_path, 3)  # a chain of 4
    monkeypatch.setattr(snapshot_format, "MAX_CHAIN_LENGTH", 3)
    with pytest.raises(SnapshotError, match="is longer than 3 snapshots"):
        _restore(tmp_path)
    monkeypatch.setattr(snapshot_format, "MAX_CHAIN_LENGTH", 4)
    assert _restore(tmp_path).table("t").rows == 50


def test_a_file_of_another_size_or_checksum_is_refused(tmp_path):
    names = _snapshots(tmp_path)
    rows = tmp_path / "snapshots" / names[0] / "t0.rows.npy"
    raw = rows.read_bytes()
    rows.write_bytes(raw + b"\0")
    with pytest.raises(SnapshotError, match=rf"{rows}: {len(raw) + 1} bytes, the manifest "
                                            rf"records {len(raw)}"):
        _restore(tmp_path)
    rows.write_bytes(raw[:-4] + b"\x7f\x7f\x7f\x7f")  # same size, another value
    with pytest.raises(SnapshotError, match=rf"{rows}: checksum mismatch"):
        _restore(tmp_path)
    rows.unlink()
    with pytest.raises(SnapshotError, match=rf"{rows}: named by the manifest, unreadable"):
        _restore(tmp_path)


def _poison(root: Path, name: str, value: float, state: bool = False) -> None:
    """Overwrite one row (or its optimizer state) of ``name`` with ``value``, its checksum and
    size recomputed: a snapshot that passes every file check."""
    d = root / "snapshots" / name
    rows = np.load(d / "t0.rows.npy")
    rows[7, 5 if state else 1] = value
    np.save(d / "t0.rows.npy", rows)
    p, m = _manifest(root, name)
    tm = m["tables"]["default/t"]
    raw = (d / "t0.rows.npy").read_bytes()
    tm["files"]["t0.rows.npy"] = hashlib.sha256(raw).hexdigest()
    tm["sizes"]["t0.rows.npy"] = len(raw)
    p.write_text(json.dumps(m))


@pytest.mark.parametrize(("value", "state"), [(np.nan, False), (np.inf, True), (-np.inf, False)])
def test_non_finite_rows_with_recomputed_checksums_are_refused(tmp_path, value, state):
    names = _snapshots(tmp_path)
    _poison(tmp_path, names[1], value, state)
    ids = np.load(tmp_path / "snapshots" / names[1] / "t0.ids.npy")
    with pytest.raises(SnapshotError, match=rf"snapshots/{names[1]}: table 'default/t' holds NaN "
                                            rf"or infinite values .* in row ID {ids[7]}"):
        _restore(tmp_path)


def test_a_manifest_without_sizes_still_restores_by_checksum(tmp_path):
    names = _snapshots(tmp_path)
    for name in names:  # as written before sizes were recorded
        p, m = _manifest(tmp_path, name)
        for tm in m["tables"].values():
            del tm["sizes"]
        p.write_text(json.dumps(m))
    assert _restore(tmp_path).table("t").rows == 50
    rows = tmp_path / "snapshots" / names[0] / "t0.rows.npy"
    rows.write_bytes(rows.read_bytes() + b"\0")
    with pytest.raises(SnapshotError, match="checksum mismatch"):
        _restore(tmp_path)


def test_ps_serve_exits_2_on_a_looping_chain_without_growing(tmp_path):
    names = _snapshots(tmp_path)
    p, m = _manifest(tmp_path, names[1])
    p.write_text(json.dumps({**m, "parent": names[1]}))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "cosparse.cli", "ps", "serve", "--shard", "0",
                           "--num-shards", "1", "--data-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert f"chain of '{names[1]}' loops" in proc.stderr and str(tmp_path) in proc.stderr
    assert time.perf_counter() - t0 < 30
