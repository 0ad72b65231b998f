"""Chaos, timeliness: a training run whose embedded shard is SIGSTOPped reports it within 5 s
with ``heartbeat_s: 1`` and then ends with nothing left running (issue 32, item 11).

The error line must not wait for the cleanup: a stopped shard cannot act on SIGTERM, so the
shard's close kills it at once instead of waiting out the SIGTERM grace.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from proctree import cmdline, descendants, kill_all, wait_gone

pytestmark = pytest.mark.chaos  # the fault suite: pytest -m chaos

CLI = [sys.executable, "-m", "cosparse.cli", "train", "--no-progress"]
LIMIT_S = 5.0


def _config(root: Path) -> str:
    cfg = {
        "data": {"reader": "synthetic", "batch_size": 256, "workers": 0,
                 "synthetic": {"num_features": 4, "num_dense": 3, "vocab_size": 5000,
                               "num_batches": 100000, "eval_batches": 1, "seed": 3}},
        "model": {"kind": "dlrm", "bottom": [8, 4], "top": [8, 1]},
        "tables": [{"name": "t", "dim": 4, "features": ["C1", "C2", "C3", "C4"]}],
        "preset": "arch-b",
        "store": {"device": {"rows": 1500}, "host": {"rows": 3000},
                  "remote": {"embedded": True, "num_shards": 2, "data_dir": str(root / "ps"),
                             "heartbeat_s": 1.0, "timeout_s": 10.0}},
        "train": {"steps": 100000, "log_every": 1, "progress": False, "threads": 1},
    }
    path = root / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put((time.monotonic(), line))
    into.put((time.monotonic(), None))


def test_a_stopped_shard_is_reported_within_5s_and_nothing_is_left(tmp_path):
    p = subprocess.Popen([*CLI, "--config", _config(tmp_path)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    out: queue.Queue = queue.Queue()
    err: queue.Queue = queue.Queue()
    readers = [threading.Thread(target=_lines, args=(p.stdout, out), daemon=True),
               threading.Thread(target=_lines, args=(p.stderr, err), daemon=True)]
    for t in readers:
        t.start()
    family: dict[int, int] = {}
    try:
        steps = 0
        deadline = time.monotonic() + 60
        while steps < 3:  # a few steps trained: the shards are serving
            _, line = out.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, f"the run ended early: {p.wait(10)}"
            steps += line.startswith("step ")
        family = descendants(p.pid)
        shards = [q for q in family if "ps serve" in cmdline(q)]
        assert len(shards) == 2, {q: cmdline(q) for q in family}
        os.kill(shards[0], signal.SIGSTOP)
        stopped_at = time.monotonic()
        while True:
            at, line = err.get(timeout=30)
            assert line is not None, "stderr closed without the PS line"
            if line.startswith("cosparse: PS unavailable"):
                break
        reported_s = at - stopped_at
        print(f"stopped shard reported after {reported_s:.2f} s")
        assert p.wait(timeout=15) == 4
        left = wait_gone(family, 2.0)[1]
        assert reported_s <= LIMIT_S, f"reported {reported_s:.1f} s after the stop: {line}"
        assert not left, {q: cmdline(q) for q in left}
    finally:
        for q in family:
            try:
                os.kill(q, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if p.poll() is None:
            p.kill()
            p.wait()
        kill_all(family)
