"""Smoke test of benchmarks/bench_row_kernels.py (``--tiny``, in this process): every figure is
there and positive, and the fused lookup and fused update it measures give the engine's numbers
bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import bench_row_kernels


def test_bench_row_kernels_tiny(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    assert bench_row_kernels.main(["--tiny", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["lookup_bit_identical"] is True
    assert res["update_bit_identical_sum"] is True and res["update_bit_identical_mean"] is True
    for key in ("lookup.engine", "lookup.fused", "update.engine", "update.fused", "init.fresh",
                "init.populated", "memset", "update_fused_over_engine",
                "lookup_fused_over_engine", "init_populated_over_fresh"):
        assert res[key] > 0, key
    assert res["config"]["tables"] == 2 and res["new_rows"] == 10_000
    assert res["machine"]["isa"]["summary"]
