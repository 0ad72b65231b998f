"""Live hit-rate health (issue 16): the bound is the best any cache of that capacity could do
under the same lookahead and pinning rules, the run reports its device hit rate over it every
interval, and it warns when a cache stays below the floor, or the trainer waits on its batches."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from cosparse.config import config_from_mapping
from cosparse.train.health import hit_rate_bound
from cosparse.train.trainer import Trainer
from cosparse.tune.cache_sim import CacheSimulator
from cosparse.tune.types import Trace


def _zipf_batches(n: int, size: int, vocab: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.unique(np.minimum(rng.zipf(1.2, size), vocab) - 1) for _ in range(n)]


@pytest.mark.parametrize("lookahead", [0, 2])
def test_the_bound_is_at_least_what_every_policy_gets(lookahead):
    """Over the same batches and capacity, no policy of the engine's keeps more rows from
    moving than the bound; the bound of the later batches alone (the first ones warming the
    cache) is the same computation on the whole trace less its head."""
    batches = _zipf_batches(60, 400, 5000, seed=3)
    cap = 2 * max(b.shape[0] for b in batches)
    whole = hit_rate_bound(batches, len(batches), cap, lookahead)
    trace = Trace.from_batches(batches, 5000)
    sim = CacheSimulator(trace)
    for policy in ("lru", "lfu", "hotness"):
        r = sim.run(cap, policy, lookahead)
        assert whole >= 1 - r.fetch_rate - 1e-12, policy
    later = hit_rate_bound(batches, 20, cap, lookahead)
    lookups = sum(b.shape[0] for b in batches[40:])
    head = CacheSimulator(Trace.from_batches(batches[:40], 5000)).run(cap, "belady", lookahead)
    assert later == pytest.approx(1 - (sim.run(cap, "belady", lookahead).fetches - head.fetches)
                                  / lookups)
    assert hit_rate_bound([], 1, cap, lookahead) is None


RUN = {
    "data": {"reader": "synthetic", "batch_size": 256, "workers": 1,
             "synthetic": {"num_features": 6, "vocab_size": 20000, "bag_min": 1, "bag_max": 3,
                           "seed": 5, "eval_batches": 1}},
    "model": {"kind": "dlrm", "bottom": [16, 8], "top": [16, 1]},
    "tables": [{"name": "a", "dim": 8, "features": [f"C{i}" for i in range(1, 7)]}],
    "store": {"device": {"rows": 2500, "policy": "lru"}},
    "supply": {"lookahead": 2},
    "train": {"steps": 60, "log_every": 10, "progress": False},
}


def _run(tmp_path, **health):
    raw = copy.deepcopy(RUN)
    raw["train"].update(metrics_json=str(tmp_path / "metrics.jsonl"), health=health)
    said: list[str] = []
    t = Trainer(config_from_mapping(raw), log=said.append)
    try:
        t.run(evaluate=False)
    finally:
        t.close()
    recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r["kind"] == "train"], [m for m in said if "health" in m]


def test_the_run_reports_its_hit_rate_over_the_bound_and_warns_below_the_floor(tmp_path):
    recs, warned = _run(tmp_path / "strict", hit_rate_floor=0.999, intervals_below=2,
                        planner_wait_share=1.0)
    ratios = [r["hit_rate.device_over_bound"] for r in recs if "hit_rate.device_over_bound" in r]
    assert len(ratios) >= 2, recs
    for r in recs:
        if "hit_rate.bound.a" in r:
            assert 0 < r["hit_rate.bound.a"] <= 1
    assert all(0 < x < 1.15 for x in ratios)  # (sampled: near 1 at best, never far above)
    assert any("table 'a': the device hit rate has stayed at" in m and "for 2 intervals" in m
               for m in warned), warned
    _, calm = _run(tmp_path / "calm", hit_rate_floor=0.01, planner_wait_share=1.0)
    assert calm == []


def test_a_trainer_waiting_on_its_batches_is_warned_once(tmp_path):
    _, warned = _run(tmp_path, hit_rate_floor=0.0, planner_wait_share=0.0001)
    waits = [m for m in warned if "the trainer waited for its batches" in m]
    assert len(waits) == 1, warned  # (once while it stays above, not every interval)


def test_health_config_is_checked():
    raw = copy.deepcopy(RUN)
    raw["train"]["health"] = {"hit_rate_floor": 1.5}
    with pytest.raises(Exception, match="train.health.hit_rate_floor"):
        config_from_mapping(raw)
