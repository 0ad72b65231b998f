"""Smoke test of benchmarks/bench_ps.py: a --tiny run (2 tables x 10k rows, batch 128, 2 PS shards,
3 alternating rounds x 2 steps) in a subprocess, checking the JSON it writes and that no shard
process of the run is left. ~30 s on 2 cores (most of it process start-up and numba JIT).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = ["-m", "benchmarks.bench_ps"]  # run from the repository root


def _ps_serve_pids(pids: list[int]) -> list[int]:
    """Those of ``pids`` that are still a live ``ps serve`` process."""
    alive = []
    for pid in pids:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"ps" in argv and b"serve" in argv:
            alive.append(pid)
    return alive


def test_bench_ps_tiny(tmp_path: Path) -> None:
    out = tmp_path / "ps.json"
    proc = subprocess.run(
        [sys.executable, *BENCH, "--tiny", "--threads", "2", "--check-versions", "--json",
         str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert set(res["samples_per_s"]) == {"ps_direct", "resident"}
    for name, s in res["samples_per_s"].items():
        assert 0 < s["min"] <= s["median"] <= s["max"], name
        assert len(s["rounds"]) == res["config"]["rounds"] == 3
    assert res["ratio"] > 0 and res["ratio_paired"] > 0
    b = res["bytes"]["trainer_ps"]
    for key in ("pull_per_step", "push_per_step", "pull_row_payload_per_step",
                "push_grad_payload_per_step"):
        assert b[key] > 0, key
    # headers included: more bytes on the wire than the row / gradient payload
    assert b["pull_per_step"] > b["pull_row_payload_per_step"]
    assert b["push_per_step"] > b["push_grad_payload_per_step"]
    assert res["ps_pull_mb_per_s"]["over_pull_wait"] >= res["ps_pull_mb_per_s"]["over_wall"] > 0
    assert res["requests_per_step"]["total"] > 0
    assert res["requests_per_step"]["PULL@prefetch"] > 0 and res["requests_per_step"]["PUSH@trainer"] > 0
    assert res["ps_wait_ms_per_step"]["total"] > 0
    assert res["ps_wait_ms_per_step"]["pull"] > 0 and res["ps_wait_ms_per_step"]["push"] > 0
    assert res["rows_per_step"]["pulled"] >= res["rows_per_step"]["unique"] > 0
    # exactness across the benchmark's processes: A (rows on the shards) == all-resident, bit for
    # bit, with every row checked against the PS's version before it trains (--check-versions),
    # and every process of the run on the same engine sources from start to end
    assert res["config"]["check_versions"] is True
    assert res["engine_sources_changed"] is False, res["machine"]["engine_sources_sha1"]
    assert res["losses_identical"] is True, res["loss_max_abs_diff"]
    assert res["loss_max_abs_diff"] == 0.0
    assert res["config"]["shards"] == 2 and res["config"]["tables"] == 2
    # every shard process is gone
    assert res["shard_processes_left"] == 0
    pids = res["contenders"]["ps_direct"]["info"]["shard_pids"]
    assert len(pids) == 2
    assert _ps_serve_pids(pids) == []
    assert "ratio (ps_direct / resident)" in proc.stdout
