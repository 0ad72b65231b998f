"""`bench_ab.py`'s alternating rounds (issue 17): each variant's rounds merged into one run, and
B over A both as the ratio of the medians and as the median of the per-round ratios."""

from __future__ import annotations

import pytest

from benchmarks import bench_ab


def _call(samples_per_s: float, pull: float, steps: int = 10, losses=(0.7, 0.6)) -> dict:
    return {"samples_per_s": samples_per_s, "measured_steps": steps, "losses": list(losses),
            "bytes_per_step": {"trainer_ps.pull": pull, "trainer_ps.push": 0.0,
                               "worker_ps": 1e5}}


def _pair(a: list[dict], b: list[dict]) -> dict:
    return {"a": bench_ab.merge_rounds(a), "b": bench_ab.merge_rounds(b)}


def test_rounds_merge_to_the_median_and_bytes_over_all_measured_steps():
    run = bench_ab.merge_rounds([_call(100.0, 1e6, steps=10), _call(300.0, 4e6, steps=30),
                                 _call(200.0, 1e6, steps=10)])
    assert run["samples_per_s"] == 200.0 and run["samples_per_s_rounds"] == [100.0, 300.0, 200.0]
    assert run["measured_steps"] == 50
    assert run["bytes_per_step"]["trainer_ps.pull"] == pytest.approx((10e6 + 120e6 + 10e6) / 50)


def test_paired_ratio_is_the_median_of_per_round_ratios_and_targets_use_it():
    # a drifting host: every round B is 1.1x A, but the medians alone say 0.98x
    free = _pair([_call(100.0, 1e6), _call(50.0, 1e6), _call(200.0, 1e6)],
                 [_call(110.0, 5e4), _call(55.0, 5e4), _call(98.0, 5e4)])
    shaped = _pair([_call(10.0, 1e6), _call(10.0, 1e6), _call(10.0, 1e6)],
                   [_call(31.0, 5e4), _call(29.0, 5e4), _call(35.0, 5e4)])
    out = bench_ab.summarize({"unlimited": free, "200mbps": shaped}, 200.0)
    assert out["samples_per_s_b_over_a.unlimited"] == pytest.approx(0.98)
    assert out["samples_per_s_b_over_a_paired.unlimited"] == pytest.approx(1.1)
    assert out["samples_per_s_b_over_a_paired.200mbps"] == pytest.approx(3.1)
    assert out["trainer_ps_bytes_b_over_a"] == pytest.approx(0.05)
    assert out["targets"] == {"trainer_ps_bytes_b_over_a<=0.1": True,
                              "samples_per_s_b_over_a_paired.unlimited>=1.0": True,
                              "samples_per_s_b_over_a_paired.200mbps>=3.0": True,
                              "loss_identical": True}


def test_a_loss_that_differs_fails_the_exactness_target():
    free = _pair([_call(100.0, 1e6)], [_call(100.0, 5e4, losses=(0.7, 0.61))])
    out = bench_ab.summarize({"unlimited": free, "200mbps": free}, 200.0)
    assert out["loss_identical"] is False and out["targets"]["loss_identical"] is False
