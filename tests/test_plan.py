"""Capacity planner: cache simulators against hand-computed answers and a plain-Python reference,
the Belady bounds on Zipf traces, and ``cosparse plan`` end to end on the Criteo sample."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from cosparse.tune import (
    CacheSimulator,
    belady_hit_rate,
    popularity_oracle_hit_rate,
    simulate,
)
from cosparse.tune.cache_sim import parse_policy
from cosparse.tune.plan import capacity_rows

REPO = Path(__file__).resolve().parents[1]
CRITEO = Path(__file__).resolve().parents[2] / "shared/data/criteo/train_head10k.txt"
DEMAND = ["lru", "lfu", "hotness", "popularity_oracle", "belady"]


def _t(*batches):
    return [np.array(b, dtype=np.int64) for b in batches]


def _zipf_trace(seed, num_batches=60, batch=40, vocab=300, alpha=1.1):
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, vocab + 1) ** alpha
    p /= p.sum()
    perm = rng.permutation(vocab)
    raw = [np.unique(perm[rng.choice(vocab, size=batch, p=p)]) for _ in range(num_batches)]
    seen = np.unique(np.concatenate(raw))
    dense = np.full(vocab, -1)
    dense[seen] = np.arange(seen.shape[0])
    return [rng.permutation(dense[b]) for b in raw], int(seen.shape[0])


# --- plain-Python reference of the documented semantics (tiny traces only) ---------------------
def _reference(trace, capacity, policy, k=0, decay=0.99):
    T = len(trace)
    sets = [list(map(int, b)) for b in trace]
    total = {}
    for b in sets:
        for i in b:
            total[i] = total.get(i, 0) + 1
    uses = {}
    resident = set()
    hits = fetches = shrinks = 0

    def next_use(i, t):
        return next((s for s in range(t + 1, T) if i in sets[s]), T)

    def key(i, t):
        past = uses.get(i, [])
        if policy == "lru":
            return past[-1] if past else -1
        if policy == "lfu":
            return len(past)
        if policy == "hotness":
            return sum(decay ** (t - s) for s in past)
        if policy == "belady":
            return -next_use(i, t)
        return total[i]

    for t in range(T):
        hits += sum(i in resident for i in sets[t])
        for i in sets[t]:
            uses.setdefault(i, []).append(t)
        kmax = min(k, T - 1 - t)
        kp = kmax
        while kp > 0 and len(set().union(*sets[t:t + kp + 1])) > capacity:
            kp -= 1
        shrinks += kp < kmax
        for d in range(kp + 1):
            for i in sets[t + d]:
                if i in resident:
                    continue
                if len(resident) == capacity:
                    free = [r for r in resident if r not in sets[t] and next_use(r, t) > t + kp]
                    far = [r for r in free if next_use(r, t) > t + k]
                    if far:
                        victim = min(far, key=lambda r: (key(r, t), r))
                    else:
                        victim = min(free, key=lambda r: (-next_use(r, t), key(r, t), r))
                    resident.remove(victim)
                resident.add(i)
                fetches += 1
    return hits, fetches, shrinks


# --- hand-computed answers ----------------------------------------------------------------------
def test_hand_computed_demand_policies():
    # C=2. At batch 3 (row 2 misses) the policies disagree about evicting row 0 or row 1:
    # lru evicts 0 (older), lfu/popularity/belady evict 1 (0 is used twice so far, 3 times in
    # all, and again at batch 4). Hotness is lfu-like at decay 0.99 and lru-like at decay 0.5
    # (0.5^2 + 0.5^3 = 0.375 < 0.5).
    tr = _t([0], [0], [1], [2], [0], [1])
    expect = {"lru": 1, "lfu": 2, "hotness": 2, "popularity_oracle": 2, "belady": 2}
    for policy, hits in expect.items():
        r = simulate(tr, 3, 2, policy)
        assert (r.hits, r.lookups, r.fetches, r.shrinks) == (hits, 6, 6 - hits, 0), policy
        assert r.hit_rate == pytest.approx(hits / 6) and r.feasible
    assert simulate(tr, 3, 2, "hotness", decay=0.5).hits == 1
    assert belady_hit_rate(tr, 3, 2) == pytest.approx(2 / 6)
    assert popularity_oracle_hit_rate(tr, 3, 2) == pytest.approx(2 / 6)


def test_hand_computed_frequency_trap():
    # Row 0 is hot early and never used again: lfu (and hotness at 0.99) keep it and thrash on
    # rows 1 and 2; lru, belady and hotness at decay 0.5 drop it. Popularity ties (3 uses each)
    # go to the smaller ID, so it also evicts 0.
    tr = _t([0], [0], [0], [1], [2], [1], [2], [1], [2])
    expect = {"lru": 6, "lfu": 2, "hotness": 2, "popularity_oracle": 6, "belady": 6}
    for policy, hits in expect.items():
        assert simulate(tr, 3, 2, policy).hits == hits, policy
    assert simulate(tr, 3, 2, "hotness", decay=0.5).hits == 6
    r = simulate(tr, 3, 2, "lru")
    assert r.hits_warm == 6 and r.lookups_warm == 9  # 9 batches: the warm-up is 0 batches


def test_prefetched_rows_count_as_hits():
    # C=2, k=1: every row is prefetched one batch ahead, so only batch 0 misses; demand
    # Belady gets 1 hit (row 0 at batch 3) but fetches fewer rows in all.
    tr = _t([0], [1], [2], [0])
    la = simulate(tr, 3, 2, "lookahead", lookahead=1)
    assert (la.policy, la.hits, la.fetches, la.shrinks) == ("lookahead-1", 3, 4, 0)
    bp = simulate(tr, 3, 2, "belady_prefetch_1")
    assert (bp.hits, bp.fetches) == (3, 4)
    b = simulate(tr, 3, 2, "belady")
    assert (b.hits, b.fetches) == (1, 3)
    assert belady_hit_rate(tr, 3, 2, lookahead=1) == pytest.approx(3 / 4)


def test_window_shrinks_when_pinned_rows_overflow():
    # C=2, k=1: batch 0's window {0,1} + {2} does not fit -> shrink to k'=0, so row 2 is not
    # prefetched and misses at batch 1; batch 1's window {2} + {0} fits, 0 stays pinned and 1 goes.
    tr = _t([0, 1], [2], [0])
    r = simulate(tr, 3, 2, "lookahead-1")
    assert (r.hits, r.fetches, r.shrinks, r.evictions) == (1, 3, 1, 1)


def test_infeasible_capacity_is_reported():
    tr = _t([0, 1, 2], [0])
    r = simulate(tr, 3, 2, "lru")
    assert not r.feasible and math.isnan(r.hit_rate) and r.hits == 0
    assert math.isnan(belady_hit_rate(tr, 3, 2))
    assert simulate(tr, 3, 3, "lru").feasible


def test_policy_names_and_capacities():
    assert parse_policy("lookahead-4") == ("lookahead", 4)
    assert parse_policy("belady_prefetch_2") == ("belady", 2)
    assert parse_policy("popularity_oracle_prefetch_3") == ("popularity_oracle", 3)
    assert parse_policy("lru", 1) == ("lru", 1)
    with pytest.raises(ValueError, match="unknown cache policy"):
        parse_policy("fifo")
    assert capacity_rows(0.1, 1000) == 100 and capacity_rows(250, 1000) == 250
    assert capacity_rows(1, 1000) == 1000 and capacity_rows(0.0001, 1000) == 1


# --- against the reference, and the bounds ----------------------------------------------------------
@pytest.mark.parametrize("seed", range(4))
def test_kernel_matches_reference(seed):
    rng = np.random.default_rng(100 + seed)
    trace, v = _zipf_trace(seed, num_batches=14, batch=6, vocab=25)
    sim = CacheSimulator(trace, v)
    for k in (0, 1, 3):
        for policy in DEMAND:
            for cap in {sim.max_unique, sim.max_unique + 2, int(rng.integers(sim.max_unique, v + 1))}:
                decay = 0.5 if policy == "hotness" else 0.99
                r = sim.run(cap, policy, k, decay)
                assert (r.hits, r.fetches, r.shrinks) == _reference(trace, cap, policy, k, decay), (
                    policy, k, cap)


@pytest.mark.parametrize("seed", range(3))
def test_belady_bounds_every_policy_on_zipf(seed):
    trace, v = _zipf_trace(seed)
    sim = CacheSimulator(trace, v)
    caps = sorted({sim.max_unique, *(max(sim.max_unique, int(f * v)) for f in (0.2, 0.3, 0.5, 0.8))})
    last = -1.0
    for cap in caps:
        best = sim.run(cap, "belady")
        assert best.hit_rate >= last  # monotone in capacity
        last = best.hit_rate
        for policy in ("lru", "lfu", "hotness", "popularity_oracle"):
            assert best.hit_rate >= sim.run(cap, policy).hit_rate, (policy, cap)
        for k in (1, 4):  # same prefetch semantics: fewest fetches, most hits
            bp = sim.run(cap, "belady", k)
            for policy in ("lookahead", "lru", "popularity_oracle"):
                other = sim.run(cap, policy, k)
                assert bp.fetches <= other.fetches and bp.hits >= other.hits, (policy, k, cap)
                assert bp.shrinks == other.shrinks  # window sizes do not depend on the policy


def test_capacity_of_all_ids_leaves_only_compulsory_misses():
    trace, v = _zipf_trace(7)
    lookups = sum(b.shape[0] for b in trace)
    for policy in DEMAND:
        r = simulate(trace, v, v, policy)
        assert r.hits == lookups - v and r.evictions == 0
        assert r.hit_rate == pytest.approx(1 - v / lookups)
    la = simulate(trace, v, v, "lookahead-4")  # prefetching hides all but batch 0's misses
    assert la.fetches == v and la.hits == lookups - trace[0].shape[0] and la.shrinks == 0


# --- cosparse plan on the Criteo sample ------------------------------------------------------------
@pytest.mark.skipif(not CRITEO.exists(), reason="Criteo sample not available")
def test_plan_command_on_criteo_sample(tmp_path):
    cfg = {
        "data": {"reader": "criteo_tsv", "path": str(CRITEO), "batch_size": 256},
        "model": {"kind": "dlrm", "bottom": [16, 8], "top": [16, 1]},
        "tables": [{"name": "cat", "dim": 8, "features": [f"C{i}" for i in range(1, 27)]}],
    }
    p = tmp_path / "plan.yaml"
    p.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "cosparse.cli", "plan", "--config", str(p), "--steps", "30",
         "--out", str(out), "--capacities", "0.05,0.1,0.2,0.5,20000"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "belady_prefetch_4" in r.stdout and "infeasible" in r.stdout
    assert "replay" in r.stderr  # progress bar
    doc = json.loads((out / "plan.json").read_text())
    assert (out / "plan.png").stat().st_size > 10_000
    for key in ("definition", "capacities", "policies", "tables", "overall", "lookahead", "batches"):
        assert key in doc
    assert doc["batches"] == 30 and doc["capacities"] == [0.05, 0.1, 0.2, 0.5, 20000]
    table = doc["tables"]["cat"]
    assert table["lookups"] > table["distinct_ids"] > table["max_unique_per_batch"] > 0
    curves = table["curves"]
    assert set(curves) == {"lru", "lfu", "hotness", "popularity_oracle", "belady", "lookahead-4",
                           "belady_prefetch_4"}
    assert curves["lru"][-1]["rows"] == 20000
    assert not curves["lru"][0]["feasible"] and curves["lru"][0]["hit_rate"] is None
    for b, lru in zip(curves["belady"], curves["lru"], strict=True):
        assert set(b) >= {"capacity", "fraction", "rows", "feasible", "hit_rate", "hit_rate_warm",
                          "fetch_rate", "hits", "lookups", "shrinks"}
        if b["feasible"]:
            assert b["hit_rate"] >= lru["hit_rate"]
    assert doc["overall"]["curves"]["belady"][-1]["hit_rate"] is not None
