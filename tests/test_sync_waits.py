"""Hand-offs that block, counted (``cosparse.waits``, the run summary's ``sync``), and the OpenMP
wait policy that every process of a run starts with (``cosparse.omp_wait``)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from cosparse import waits
from cosparse.config import config_from_mapping
from cosparse.ps.embedded import EmbeddedShards
from cosparse.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]


def test_a_counted_lock_counts_only_the_acquires_that_waited():
    lock = waits.CountedLock("test.lock")
    before = waits.snapshot()
    for _ in range(5):
        with lock:  # uncontended (and re-entrant): no wait
            with lock:
                pass
    assert "test.lock" not in waits.snapshot().since(before).sites
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with lock:
            held.set()
            release.wait(5)

    t = threading.Thread(target=holder)
    t.start()
    held.wait(5)
    threading.Timer(0.05, release.set).start()
    with lock:  # blocks until the holder lets go
        pass
    t.join()
    n, blocked = waits.snapshot().since(before).sites["test.lock"]
    assert n == 1 and blocked >= 0.04


def test_waits_per_step_are_per_batch_not_per_table():
    """A tiered run of 6 tables, 1 data worker, planned 2 batches ahead: each stage hands a
    batch over at most once per step, whatever the number of tables."""
    raw = {
        "data": {"reader": "synthetic", "batch_size": 256, "workers": 1,
                 "synthetic": {"num_features": 6, "num_dense": 4, "vocab_size": 5000,
                               "num_batches": 40}},
        "model": {"kind": "dlrm", "bottom": [8, 4], "top": [8, 1]},
        "tables": [{"name": f"t{i}", "dim": 4, "features": [f"C{i + 1}"]} for i in range(6)],
        "store": {"device": {"rows": 600}, "host": {"policy": "lfu"}},
        "supply": {"lookahead": 2},
        "train": {"steps": 30, "progress": False, "log_every": 100},
    }
    t = Trainer(config_from_mapping(raw), log=lambda m: None)
    try:
        sync = t.run(evaluate=False)["sync"]
    finally:
        t.close()
    assert set(sync["by_site"]) <= {"data_worker", "trainer<-prefetch", "planner<-trainer",
                                    "lock.table", "lock.slab", "lock.ids"}, sync
    for site, w in sync["by_site"].items():
        assert w["waits"] <= 1.0, (site, sync)  # one hand-off per batch, at most
    assert sync["waits_per_step"] <= 3.0, sync


def _policy(code: str, **env: str) -> str:
    e = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], env=e, cwd=REPO, capture_output=True,
                          text=True, check=True, timeout=60).stdout.strip()


def test_importing_cosparse_makes_openmp_waits_passive_unless_told_otherwise():
    show = "import os; print(os.environ.get('OMP_WAIT_POLICY'), omp_wait.state()['source'])"
    assert _policy(f"from cosparse import omp_wait; {show}") == "PASSIVE cosparse"
    assert _policy(f"from cosparse import omp_wait; {show}",
                   OMP_WAIT_POLICY="active") == "active environment"
    # too late for this process once torch has loaded libgomp (the state says why), but set
    # for the processes it starts
    assert _policy(f"import torch; from cosparse import omp_wait; {show}") == \
        "PASSIVE torch imported before cosparse"


def test_embedded_shards_run_one_passive_thread_each(tmp_path):
    shards = EmbeddedShards(1, data_dir=tmp_path)
    try:
        env = dict(kv.split("=", 1) for kv in
                   Path(f"/proc/{shards.pids[0]}/environ").read_text().split("\0") if "=" in kv)
    finally:
        shards.close()
    assert env["NUMBA_NUM_THREADS"] == "1" and env["OMP_NUM_THREADS"] == "1"
    assert env["OMP_WAIT_POLICY"].upper() == "PASSIVE"
