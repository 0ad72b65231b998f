"""Smoke test of benchmarks/bench_tiers.py: a --tiny run (2 tables x 10k rows, batch 128, device 1k
rows, 5 alternating rounds x 2 steps) in a subprocess, checking the JSON it writes. ~20 s on 2 cores.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = ["-m", "benchmarks.bench_tiers"]  # run from the repository root
CONTENDERS = {"resident", "dev10_host100", "dev10_host25_spill"}


def test_bench_tiers_tiny(tmp_path: Path) -> None:
    out = tmp_path / "tiers.json"
    proc = subprocess.run(
        [sys.executable, *BENCH, "--tiny", "--threads", "2", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert set(res["samples_per_s"]) == CONTENDERS
    for name, s in res["samples_per_s"].items():
        assert 0 < s["min"] <= s["median"] <= s["max"], name
        assert len(s["rounds"]) == res["config"]["rounds"] == 5
    for key in ("tiered_over_resident", "spill_over_resident", "belady_hit_rate",
                "popularity_oracle_no_transfer", "policy_over_belady",
                "policy_over_popularity_oracle", "policy_over_bound"):
        assert res[key] > 0, key
    # the fair bound (Belady at the same lookahead, prefetches counted) is below demand Belady's
    assert res["policy_over_bound"] >= res["policy_over_belady"]
    assert set(res["hit_rate"]["device"]) == {"lru", "lfu", "hotness"}
    assert all(0 < v <= 1 for v in res["hit_rate"]["device"].values())
    assert res["hit_rate"]["plan_only_matches_trained"] is True
    for name in ("dev10_host100", "dev10_host25_spill"):
        assert 0 <= res["hit_rate"]["host"][name] <= 1
        assert res["bytes_per_batch"][name]["host_device"] > 0
        assert res["lookahead_shrinks"][name] >= 0
        assert 0 < res["hbm_share"][name] <= 1
    assert res["bytes_per_batch"]["dev10_host25_spill"]["host_backing"] > 0
    for p in ("lru", "lfu", "hotness"):
        assert 0 < res["engine_vs_simulator"][p]["simulator"] <= 1
    assert set(res["targets"]) == {"tiered_over_resident", "tiered_over_resident_paired",
                                   "spill_over_resident_paired", "policy_over_belady",
                                   "policy_over_popularity_oracle", "policy_over_bound",
                                   "bytes_per_row_overhead"}
    for name in ("dev10_host100", "dev10_host25_spill"):  # at least the ID map, slot map, hotness
        assert 8 + 8 + 4 < res["bytes_per_row_overhead"][name] < 1000, name
        assert res["memory_overhead"][name]["live_rows"] > res["config"]["device_rows"]
    t = res["targets"]["bytes_per_row_overhead"]
    assert t["target"] == 24 and t["value"] == max(res["bytes_per_row_overhead"].values())
    assert f"TARGET bytes_per_row_overhead <= 24.0: {t['value']} " in proc.stdout
    assert res["config"]["tables"] == 2 and res["config"]["device_rows"] == 1000
    assert "TARGET tiered_over_resident >= 0.8" in proc.stdout
    for k, goal in (("tiered_over_resident_paired", 0.9), ("spill_over_resident_paired", 0.85)):
        assert res["targets"][k] == {"value": res[k], "target": goal, "pass": res[k] >= goal}
