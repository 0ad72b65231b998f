"""Nothing left behind, nothing stale (issue 11, defects 5 and 6).

- Owner tags: the sweep removes what dead owners left (a free PID, a reused one), never a live
  owner's or another node's.
- A save killed halfway, and the shared-memory directory of a killed trainer, are swept by the
  next run; a live run's are not.
- Checkpoints fsync ``dense.pt`` and ``LATEST`` before committing them.
- Helper processes end with their parent: ``ps serve --parent-pid`` even while clients keep it
  busy; a data worker in the middle of a build and the fork server; and shards started from a
  thread that ends are not killed with that thread.
- PS snapshots are pruned with the checkpoints' ``keep``, never a full one that a kept
  incremental one needs.
- A run that would start at step 0 on an earlier run's PS snapshots is refused (exit 2), and
  ``--fresh`` discards them.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from exactness import base_config, ps_direct
from proctree import alive, cmdline, descendants, kill_all, wait_gone

from cosparse.cli import main
from cosparse.config import Config, TableConfig, validate
from cosparse.owner import node_id, owner_tag, start_time, sweep
from cosparse.ps import snapshots
from cosparse.ps.client import PSClient
from cosparse.ps.embedded import EmbeddedShards
from cosparse.ps.shard import Shard
from cosparse.train.checkpoint import TrainState, checkpoints, read_meta, save_checkpoint
from cosparse.train.leftovers import sweep_dead_runs
from cosparse.train.trainer import Trainer

TESTS = Path(__file__).resolve().parent


def _python(code: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, **kw)


def _dead_tag() -> str:
    """The owner tag of a process that has exited."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        tag = owner_tag(p.pid)
    finally:
        p.kill()
        p.wait()
    return tag


# --- owner tags and the sweep ----------------------------------------------------------------
def test_sweep_removes_only_what_dead_owners_left(tmp_path):
    me = owner_tag()
    node, pid, start = me.split(".")[1:]
    dead = _dead_tag()
    names = {
        "live": f"cosparse-b-{me}-x",
        "dead": f"cosparse-b-{dead}-x",
        "reused": f"cosparse-b-own.{node}.{pid}.{int(start) - 1}-x",  # our PID, another start
        "other-node": f"cosparse-b-own.{'0' * 8 if node != '0' * 8 else '1' * 8}.1.1-x",
        "untagged": "cosparse-b-abcdef",
        "other-prefix": f"other-{dead}",
    }
    for n in names.values():
        (tmp_path / n).mkdir()
    (tmp_path / f"cosparse-f-{dead}").write_text("a file")
    removed = {p.name for p in sweep(tmp_path, ["cosparse-"])}
    assert removed == {names["dead"], names["reused"], f"cosparse-f-{dead}"}
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {names[k] for k in ("live", "other-node", "untagged", "other-prefix")}
    assert start_time(os.getpid()) == int(start) and node == node_id()


def _in_save(root: Path, after: str) -> subprocess.Popen:
    """A process in the middle of a save of ``root`` (its part on disk, before the commit), that
    then runs ``after`` (e.g. SIGKILLs itself)."""
    return _python(f"""
        import os, signal, sys, time, torch
        from cosparse.train.checkpoint import TrainState, save_checkpoint
        def before_commit():
            print("in save", flush=True)
            {after}
        save_checkpoint({str(root)!r}, TrainState(3, 0, 3), {{"w": torch.zeros(2)}}, {{}}, {{}},
                        before_commit=before_commit)
    """)


def test_a_save_killed_halfway_is_swept_by_the_next_run_and_a_live_one_is_not(tmp_path):
    root = tmp_path / "ck"
    cfg = Config()
    cfg.train.checkpoint.dir = str(root)
    live = _in_save(root, "time.sleep(60)")
    try:
        assert live.stdout.readline().strip() == "in save"
        killed = _in_save(root, "os.kill(os.getpid(), signal.SIGKILL)")
        killed.wait(timeout=60)
        assert killed.returncode == -signal.SIGKILL
        tmps = {p.name for p in root.glob(".tmp-step_*")}
        assert len(tmps) == 2 and all(f".{live.pid}." in n or f".{killed.pid}." in n for n in tmps)
        removed = sweep_dead_runs(cfg)
        assert [p.name for p in removed if p.parent == root] == \
            [n for n in tmps if f".{killed.pid}." in n]
        assert [p.name for p in root.glob(".tmp-step_*")] == [n for n in tmps if f".{live.pid}." in n]
    finally:
        live.kill()
        live.wait()
    sweep_dead_runs(cfg)
    assert not list(root.glob(".tmp-*")) and not (root / "LATEST").exists()


def test_checkpoint_fsyncs_dense_and_latest_before_committing(tmp_path, monkeypatch):
    synced: list[str] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    save_checkpoint(tmp_path, TrainState(5, 0, 5), {"w": torch.ones(3)},
                    {"t": {"ids": np.arange(3)}}, {})
    tmp = next(p for p in synced if "/.tmp-step_00000005-" in p).rsplit("/", 1)[0]
    for name in ("dense.pt", "table-t.npz", "meta.json"):
        assert f"{tmp}/{name}" in synced, (name, synced)
    assert str(tmp_path / ".LATEST.tmp") in synced, synced  # the new LATEST, before its rename
    assert synced.index(str(tmp_path / ".LATEST.tmp")) < synced.index(str(tmp_path))
    assert (tmp_path / "LATEST").read_text() == "step_00000005"


def test_shared_memory_of_a_killed_trainer_is_swept_and_a_live_ones_kept(tmp_path):
    code = """
        import time
        from cosparse.supply.shared_memory import shared_dir
        d = shared_dir("cosparse-b-")
        open(d + "/resident.filter", "wb").write(bytes(4096))
        print(d, flush=True)
        time.sleep(60)
    """
    live, killed = _python(code), _python(code)
    try:
        live_dir, killed_dir = Path(live.stdout.readline().strip()), Path(killed.stdout.readline().strip())
        assert live_dir.is_dir() and killed_dir.is_dir()
        killed.kill()
        killed.wait()
        removed = sweep_dead_runs(Config())
        assert killed_dir in removed and not killed_dir.exists()
        assert live_dir.is_dir() and live_dir not in removed
    finally:
        live.kill()
        live.wait()
        killed.kill()
        killed.wait()
    assert live_dir in sweep_dead_runs(Config()) and not live_dir.exists()


# --- helper processes end with their parent --------------------------------------------------
def test_ps_serve_parent_pid_exits_within_5s_even_while_clients_keep_it_busy(tmp_path):
    """The parent-pid watch used to run only after 200 ms without a request: a shard that
    clients kept busy outlived its dead parent. (No PDEATHSIG here: the watch alone.)"""
    ready = tmp_path / "endpoint"
    parent = _python(f"""
        import os, subprocess, sys, time
        p = subprocess.Popen([sys.executable, "-m", "cosparse.cli", "ps", "serve", "--shard", "0",
                              "--num-shards", "1", "--data-dir", {str(tmp_path / 'd')!r},
                              "--ready-file", {str(ready)!r}, "--parent-pid", str(os.getpid())])
        print(p.pid, flush=True)
        time.sleep(120)
    """)
    shard = int(parent.stdout.readline())
    procs = {shard: start_time(shard)}
    stop = threading.Event()
    pings = [0]
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert time.monotonic() < deadline and parent.poll() is None, "the shard did not start"
            time.sleep(0.05)
        client = PSClient([ready.read_text().strip()], timeout_s=10)

        def busy() -> None:
            while not stop.is_set():
                try:
                    client.ping()
                    pings[0] += 1
                except Exception:  # noqa: BLE001 - the shard is gone: done
                    return
                time.sleep(0.02)

        pinger = threading.Thread(target=busy, daemon=True)
        pinger.start()
        time.sleep(1.0)
        parent.kill()
        parent.wait()
        waited, left = wait_gone(procs, 10.0)
        stop.set()
        pinger.join(timeout=15)
        client.close()
        assert not left, f"the shard still runs {waited:.1f} s after its parent's death ({pings[0]} pings)"
        assert waited <= 5.0, waited
    finally:
        stop.set()
        parent.kill()
        parent.wait()
        kill_all(procs)


def test_shards_started_from_a_thread_that_ends_keep_serving(tmp_path):
    """PR_SET_PDEATHSIG follows the forking *thread*: set from a thread that ends, it killed
    the shards while their owner lived. It is set only from the main thread now."""
    box: dict[str, EmbeddedShards] = {}
    t = threading.Thread(target=lambda: box.update(s=EmbeddedShards(
        2, [TableConfig(name="t", dim=4, features=["a"])], tmp_path / "ps")))
    t.start()
    t.join()
    shards = box["s"]
    try:
        time.sleep(3.0)
        assert [p.poll() for p in shards.procs] == [None, None]
        with shards.client(timeout_s=10) as c:
            assert c.pull("t", np.arange(6, dtype=np.int64)).rows.shape == (6, 4)
    finally:
        shards.close()


def test_data_worker_and_fork_server_exit_within_5s_of_the_trainer_even_mid_build(tmp_path):
    """A worker checked its parent only between batches, and the fork server lived as long as
    any worker: a trainer killed during a long build left both running."""
    marker = tmp_path / "worker.pid"
    trainer = _python(f"""
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        from slow_reader import SlowReader
        from cosparse.data.pool import BatchStream
        s = BatchStream(SlowReader({str(marker)!r}), workers=1, queue_depth=1)
        print(s.pids[0], flush=True)
        next(s)
    """)
    procs: dict[int, int] = {}
    try:
        worker = int(trainer.stdout.readline())
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert time.monotonic() < deadline and trainer.poll() is None, "no build started"
            time.sleep(0.05)
        procs = descendants(trainer.pid)
        assert worker in procs and len(procs) >= 3, procs  # worker, fork server, resource tracker
        trainer.kill()
        trainer.wait()
        waited, left = wait_gone(procs, 10.0)
        assert not left, f"still running {waited:.1f} s after the trainer's SIGKILL: {sorted(left)}"
        assert waited <= 5.0, waited
    finally:
        trainer.kill()
        trainer.wait()
        kill_all(procs)


# --- PS snapshots pruned with keep ---------------------------------------------------------
def test_ps_snapshot_pruning_keeps_what_kept_snapshots_need(tmp_path):
    table = TableConfig(name="t", dim=4, features=["a"])
    sh = Shard(0, 1)
    sh.register([table])
    names, rows = [], {}
    for i, incremental in enumerate([False, False, True, True, False]):
        sh.pull("t", np.arange(10 * i, 10 * i + 10, dtype=np.int64))  # new rows: dirty
        names.append(sh.snapshot(tmp_path, incremental=incremental))
        rows[names[-1]] = sh.dump("t")
    assert [n.split("-")[1] for n in names] == ["full", "full", "incr", "incr", "full"]
    assert snapshots.chain(tmp_path, names[3]) == [names[3], names[2], names[1]]
    removed = snapshots.prune(tmp_path, [names[3]])  # LATEST (names[4]) is kept too
    assert removed == [names[0]]
    assert sorted(p.name for p in (tmp_path / "snapshots").iterdir()) == sorted(names[1:])
    again = Shard(0, 1)
    assert again.restore(tmp_path, names[3]) == names[3]
    ids, got = again.dump("t")
    want_ids, want = rows[names[3]]
    order, want_order = np.argsort(ids), np.argsort(want_ids)
    assert np.array_equal(ids[order], want_ids[want_order])
    assert np.array_equal(got[order], want[want_order])
    assert snapshots.prune(tmp_path, []) == [names[1], names[2], names[3]]  # only LATEST's chain


def test_a_snapshot_after_a_restore_never_reuses_an_orphans_number(tmp_path):
    """A shard killed between renaming its snapshot into place and moving LATEST leaves that
    snapshot behind, uncommitted; the resumed run's next snapshot takes a new number instead of
    failing on the orphan's directory (seen in CI: "Directory not empty")."""
    table = TableConfig(name="t", dim=4, features=["a"])
    sh = Shard(0, 1)
    sh.register([table])
    sh.pull("t", np.arange(10, dtype=np.int64))
    first = sh.snapshot(tmp_path, incremental=False)
    orphan = sh.snapshot(tmp_path, incremental=False)  # the killed run's, never committed
    (tmp_path / "LATEST").write_text(first)  # killed after the rename, before LATEST moved
    again = Shard(0, 1)
    assert again.restore(tmp_path, first) == first
    nxt = again.snapshot(tmp_path, incremental=False)
    assert nxt not in (first, orphan) and (tmp_path / "snapshots" / orphan).is_dir()


def _durable_ps_config(tmp_path: Path, incremental: bool) -> Config:
    cfg = copy.deepcopy(ps_direct(base_config("zipf", "sgd"), num_shards=2, lookahead=1))
    cfg.train.steps = 12
    cfg.store.remote.data_dir = str(tmp_path / "ps")
    cfg.train.checkpoint.dir = str(tmp_path / "ck")
    cfg.train.checkpoint.every = 2
    cfg.train.checkpoint.keep = 2
    cfg.train.checkpoint.incremental = incremental
    return validate(cfg)


@pytest.mark.parametrize("incremental", [False, True])
def test_trainer_prunes_ps_snapshots_with_its_checkpoints(tmp_path, incremental):
    """A 120-step run used to keep every snapshot (25 full ones per shard, 405 MB). Incremental
    snapshots take a full one every `keep` saves, so their chains can be pruned too."""
    cfg = _durable_ps_config(tmp_path, incremental=incremental)
    t = Trainer(cfg, log=lambda m: None)
    try:
        t.run(evaluate=False)
    finally:
        t.close()
    kept = checkpoints(tmp_path / "ck")
    assert [p.name for p in kept] == ["step_00000010", "step_00000012"]
    for i in range(2):
        on_disk = sorted(p.name for p in (tmp_path / "ps" / f"shard-{i}" / "snapshots").iterdir())
        named = {read_meta(p)["ps"]["snapshots"][i] for p in kept}
        need = sorted({n for name in named for n in snapshots.chain(tmp_path / "ps" / f"shard-{i}",
                                                                   name)})
        assert on_disk == need and len(on_disk) == 2, (on_disk, named)  # of the 6 taken
    resumed = Trainer(cfg, log=lambda m: None)  # the older kept checkpoint still restores
    try:
        resumed.resume(str(kept[0]))
        assert resumed.state.step == 10
        resumed.run(steps=11, evaluate=False)
    finally:
        resumed.close()


# --- defect 6: a fresh run on an earlier run's PS snapshots ------------------------------------
def test_fresh_run_on_earlier_snapshots_is_refused_with_exit_2_and_fresh_discards_them(
        tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # (each run's metrics directory under runs/ there)
    raw = {
        "preset": "arch-a",
        "data": {"reader": "synthetic", "batch_size": 64,
                 "synthetic": {"num_features": 4, "num_dense": 2, "vocab_size": 2000,
                               "num_batches": 1000, "eval_batches": 1}},
        "model": {"kind": "dlrm", "bottom": [8, 4], "top": [8, 1]},
        "tables": [{"name": "cat", "dim": 4, "features": ["C1", "C2", "C3", "C4"]}],
        "store": {"remote": {"num_shards": 2, "data_dir": str(tmp_path / "ps")}},
        "train": {"steps": 4, "log_every": 2, "progress": False, "threads": 1,
                  "checkpoint": {"dir": str(tmp_path / "ck"), "every": 2}},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    ck, ps = tmp_path / "ck", tmp_path / "ps"
    assert main(["train", "--config", str(path)]) == 0
    before = {p: p.stat().st_mtime_ns for p in ps.glob("shard-*/snapshots/*")}
    assert len(before) == 4 and (ck / "LATEST").read_text() == "step_00000004"
    capsys.readouterr()

    assert main(["train", "--config", str(path), "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert "store.remote.data_dir" in err and "earlier run" in err, err
    assert f"--resume {ck}" in err and "--fresh" in err, err
    assert {p: p.stat().st_mtime_ns for p in ps.glob("shard-*/snapshots/*")} == before  # untouched
    assert (ck / "LATEST").read_text() == "step_00000004" and len(checkpoints(ck)) == 2

    assert main(["train", "--config", str(path), "--steps", "2", "--fresh"]) == 0
    out = capsys.readouterr()
    assert "--fresh: discarded 4 PS snapshots" in out.out + out.err
    assert [p.name for p in checkpoints(ck)] == ["step_00000002"]
    assert sorted(p.name for p in ps.glob("shard-*/snapshots/*")) == ["00000001-full"] * 2
    final = json.loads((out.out.strip().splitlines())[-1])["final"]
    assert final["step"] == 2

    assert main(["train", "--config", str(path), "--resume", str(ck)]) == 0  # goes on: step 4
    assert (ck / "LATEST").read_text() == "step_00000004"
    shards = {p: st for p, st in descendants(os.getpid()).items() if "ps serve" in cmdline(p)}
    assert not alive(shards)  # every shard of the four runs was stopped
