"""Smoke tests of benchmarks/bench_quality.py (``--tiny``, in this process), one per family:
its figures are there, cosparse's placements equal its resident run, and the peer either ran
(.venv-quality present) or says why not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_quality, quality_multitask, quality_retrieval, quality_sequence


@pytest.mark.skipif(not quality_multitask.TAOBAO.exists(), reason="the Taobao log is absent")
def test_bench_quality_multitask_tiny(tmp_path: Path) -> None:
    out = tmp_path / "quality.json"
    assert bench_quality.main(["--tiny", "--family", "multitask", "--json", str(out)]) == 0
    res = json.loads(out.read_text())["multitask"]
    assert [r["seed"] for r in res["ours"]["runs"]] == [0, 1]
    assert sorted(res["ours"]["runs"][0]["auc"]) == ["buy", "cart_fav", "click"]
    assert sorted(res["single_task"]["auc"]) == ["buy", "cart_fav", "click"]
    assert res["placements_equal_resident"] == {"tiered": True}
    if res["peer"] is None:
        assert res["peer_why"] and res["diff"] is None
    else:
        assert len(res["peer"]["runs"]) == 2 and res["speed_over_peer"] > 0
        assert res["diff_se"] >= 0


@pytest.mark.skipif(not quality_retrieval.MOVIELENS.exists(), reason="MovieLens is absent")
def test_bench_quality_retrieval_tiny(tmp_path: Path) -> None:
    out = tmp_path / "quality.json"
    assert bench_quality.main(["--tiny", "--family", "retrieval", "--json", str(out)]) == 0
    res = json.loads(out.read_text())["retrieval"]
    assert [r["seed"] for r in res["ours"]["runs"]] == [0, 1]
    for m in ("recall@10", "ndcg@10", "mrr", "recall@10.popularity"):
        assert 0 <= res["ours"][m] <= 1, m
    assert res["placements_equal_resident"] == {"tiered": True}
    if res["peer"] is None:
        assert res["peer_why"] and res["diff"] is None
    else:
        assert len(res["peer"]["runs"]) == 2 and res["speed_over_peer"] > 0
        assert 0 <= res["peer"]["recall@10"] <= 1


@pytest.mark.skipif(not quality_sequence.BEAUTY.exists(), reason="Amazon Beauty is absent")
def test_bench_quality_sequence_tiny(tmp_path: Path) -> None:
    out = tmp_path / "quality.json"
    assert bench_quality.main(["--tiny", "--family", "sequence", "--json", str(out)]) == 0
    res = json.loads(out.read_text())["sequence"]
    assert [r["seed"] for r in res["ours"]["runs"]] == [0, 1] and res["epochs"] == 1
    for m in ("recall@10", "ndcg@10", "mrr", "recall@10.popularity"):
        assert 0 <= res["ours"][m] <= 1, m
    assert res["placements_equal_resident"] == {"tiered": True}
    assert res["published"]["recall@10"] > 0 and res["published"]["source"]
    if res["peer"] is None:
        assert res["peer_why"] and res["diff"] is None
    else:
        assert len(res["peer"]["runs"]) == 2 and res["speed_over_peer"] > 0
        assert 0 <= res["peer"]["recall@10"] <= 1
