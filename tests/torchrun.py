"""One ``torchrun`` of gloo ranks on this machine, for the multi-rank tests: its output, or the
test failed naming the script, its rank count and the tail of its output. It is killed, with
every process it started, when it overruns."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.proctree import descendants, wait_gone

ROOT = Path(__file__).resolve().parents[1]


def run_ranks(script: Path, args: list[str], timeout_s: float, ranks: int = 2) -> str:
    """``script args`` on ``ranks`` local ranks (``tests/`` importable, one OpenMP thread
    each); its combined stdout and stderr."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
           "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", str(script), *args]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True, text=True)
    try:
        log, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kids = descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        wait_gone(kids, 10)
        pytest.fail(f"the {ranks}-rank run of {script.name} did not finish in {timeout_s} s:\n"
                    f"{log[-4000:]}")
    assert proc.returncode == 0, f"the {ranks}-rank run of {script.name} failed:\n{log[-6000:]}"
    return log
