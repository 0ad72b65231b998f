"""Chaos, SIGTERM of a hung trainer (issue 32, item 12): a training run whose embedded shard is
SIGSTOPped hangs in a PS call (``heartbeat_s: 30`` and a long request timeout: the silence is not
detected for a long time); SIGTERM then ends it within 5 s, with its "terminated" line and exit
code 143, and leaves nothing behind: no process, no shared-memory or temporary directory.

The PS call in flight, on the trainer's prefetch thread or its own, is cancelled by the
termination (``cosparse.stopping``) instead of being waited out.
"""

from __future__ import annotations

import glob
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml
from proctree import cmdline, descendants, kill_all, wait_gone
from test_chaos_report import _config as _report_config
from test_chaos_report import _lines

pytestmark = pytest.mark.chaos  # the fault suite: pytest -m chaos

CLI = [sys.executable, "-m", "cosparse.cli", "train", "--no-progress"]
LIMIT_S = 5.0


def _config(root: Path) -> str:
    path = _report_config(root)
    cfg = yaml.safe_load(Path(path).read_text())
    cfg["store"]["remote"].update(heartbeat_s=30.0, timeout_s=120.0)
    cfg["train"]["stall_timeout_s"] = 300
    Path(path).write_text(yaml.safe_dump(cfg))
    return path


def _owned_by(pid: int) -> list[str]:
    """The shared-memory and temporary entries named for process ``pid`` (``cosparse.owner``)."""
    return [p for base in ("/dev/shm", tempfile.gettempdir())
            for p in glob.glob(os.path.join(base, f"*own.*.{pid}.*"))]


def test_sigterm_of_a_trainer_hung_on_a_stopped_shard_exits_within_5s_leaving_nothing(tmp_path):
    p = subprocess.Popen([*CLI, "--config", _config(tmp_path)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    out: queue.Queue = queue.Queue()
    err: queue.Queue = queue.Queue()
    for stream, into in ((p.stdout, out), (p.stderr, err)):
        threading.Thread(target=_lines, args=(stream, into), daemon=True).start()
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
        assert _owned_by(p.pid), "the run made no shared-memory directory (arch-b has one)"
        os.kill(shards[0], signal.SIGSTOP)
        time.sleep(1.0)  # the trainer hangs in a call to it
        p.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        try:
            code = p.wait(timeout=LIMIT_S + 10)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - t0
        lines: list[str] = []
        while (item := err.get(timeout=5)[1]) is not None:
            lines.append(item)
        text = "".join(lines)
        print(f"exited {code} {took:.2f} s after SIGTERM\n{text[-2000:]}")
        left = wait_gone(family, 2.0)[1]
        assert took <= LIMIT_S, f"exited {took:.1f} s after SIGTERM"
        assert code == 143, text
        assert "cosparse: terminated (SIGTERM)" in text, text
        assert not left, {q: cmdline(q) for q in left}
        assert _owned_by(p.pid) == []
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
