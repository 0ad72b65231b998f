"""`bench_ab.py --sweep` (issue 16): A against B one factor at a time; each cell's b_over_a, and
where B loses with the reason read from the counters."""

from __future__ import annotations

import json

from benchmarks import bench_ab
from benchmarks.ab_sweep import Cell, CellResult, cells, summarize, why_b_loses


def _run(samples_per_s: float, stages: dict, hit: float, **extra) -> dict:
    return {"samples_per_s": samples_per_s, "stage_ms": stages, "hit_rate": {"device": hit},
            "bytes_per_step": {"trainer_ps.pull": 2e6, "trainer_ps.push": 1e6,
                               "worker_ps": extra.pop("worker_ps", None)}, **extra}


def test_the_sweep_has_about_twenty_cells_one_factor_at_a_time():
    all_cells, quick = cells(), cells(quick=True)
    assert 15 <= len(all_cells) <= 22 and set(quick) <= set(all_cells) and len(quick) == 9
    assert {c.factor for c in all_cells} == {"base", "locality", "link", "device_share",
                                             "sequence_length"}
    base = Cell("base", "base", None)
    for c in all_cells:  # each cell changes one factor of the base point
        changed = [f for f in ("alpha", "link_mbps", "share", "fits", "seq_len")
                   if getattr(c, f) != getattr(base, f)]
        assert len(changed) <= 1, (c.name, changed)


def test_where_b_loses_names_the_stages_and_counters_that_cost_it():
    a = _run(1000.0, {"read": 1.0, "fill": 2.0}, hit=0.95)
    b = _run(900.0, {"read": 4.0, "fill": 2.1}, hit=0.95, worker_ps=1e6,
             **{"wasted_bytes_per_step.worker_ps": 3e5, "stale_drops": 12, "fallbacks": 0})
    lost = CellResult(Cell("zipf_1.4", "locality", 1.4, alpha=1.4), {"a": a, "b": b})
    won = CellResult(Cell("link_200mbps", "link", 200, link_mbps=200),
                     {"a": _run(500.0, {}, 0.5), "b": _run(1500.0, {}, 0.5)})
    why = why_b_loses(lost)
    assert "read +3.0 ms/step (A 1.0, B 4.0)" in why and "fill" in why
    assert "device hit rate is 0.95" in why and "the link is unlimited" in why
    assert "30% of the workers' PS bytes" in why and "12 delivered rows dropped as stale" in why
    out = summarize([lost, won])
    assert [w["cell"] for w in out["where_b_loses"]] == ["zipf_1.4"]
    assert out["cells"]["link_200mbps"]["b_over_a"] == 3.0
    assert abs(out["where_b_loses"][0]["b_over_a"] - 0.9) < 1e-12


def test_bench_ab_sweep_runs_a_real_cell_and_writes_json_and_report(tmp_path):
    out = tmp_path / "sweep.json"
    assert bench_ab.main(["--sweep", "--tiny", "--cells", "din_seq_1", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    cell = res["cells"]["din_seq_1"]
    assert cell["error"] is None and cell["b_over_a"] > 0
    assert cell["samples_per_s"]["a"] > 0 and cell["samples_per_s"]["b"] > 0
    assert isinstance(res["where_b_loses"], list)
    for w in res["where_b_loses"]:
        assert w["b_over_a"] < 1 and w["reason"]
    html = out.with_suffix(".html").read_text()
    assert "<svg" in html and "Where B loses" in html
