"""Rounding float32 row values to fp16/bf16 (issue 37, item 2): nearest rounding is torch's;
stochastic rounding lands on one of the two neighbours, is unbiased within a bound over many
keys, and is a pure function of (seed, step, row ID, column)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cosparse.optim.rounding import rounded

TORCH = {"fp16": torch.float16, "bf16": torch.bfloat16}


def widened(bits: np.ndarray, dtype: str) -> np.ndarray:
    return torch.from_numpy(bits.view(np.int16)).view(TORCH[dtype]).float().numpy()


def _values() -> np.ndarray:
    rng = np.random.default_rng(0)
    v = np.concatenate([rng.normal(0, 1, 500), rng.normal(0, 1e-3, 200),
                        rng.normal(0, 1e-6, 100), rng.normal(0, 300, 100),  # (fp16 subnormals)
                        [0.0, -0.0, 1.0, -1.0, 65504.0, 1e-8, 3.0e-5, np.inf, -np.inf]])
    return v.astype(np.float32).reshape(1, -1)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_nearest_is_torchs_round_to_nearest_even(dtype):
    v = _values()
    got = rounded(v, np.array([7]), 0, 1, dtype, "nearest")
    want = torch.from_numpy(v).to(TORCH[dtype]).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_stochastic_lands_on_a_neighbour_and_is_keyed(dtype):
    v = _values()
    ids = np.array([3])
    got = rounded(v, ids, 5, 9, dtype, "stochastic")
    assert np.array_equal(got, rounded(v, ids, 5, 9, dtype, "stochastic"))  # (pure)
    assert not np.array_equal(got, rounded(v, ids, 5, 10, dtype, "stochastic"))  # (the step)
    assert not np.array_equal(got, rounded(v, np.array([4]), 5, 9, dtype, "stochastic"))
    x = torch.from_numpy(v[0]).double()
    down = torch.from_numpy(widened(rounded(v, ids, 0, 0, dtype, "nearest"), dtype)[0]).double()
    value = torch.from_numpy(widened(got, dtype)[0]).double()
    finite = torch.isfinite(x) & (x.abs() < 65000)
    # each value is the nearest one or its neighbour on the value's other side
    spacing = torch.where(x.abs() > 0, x.abs() * (2.0 ** -7 if dtype == "bf16" else 2.0 ** -10),
                          torch.zeros_like(x))
    spacing = torch.maximum(spacing, torch.full_like(x, 2.0 ** -24 if dtype == "fp16" else 0))
    assert ((value - x).abs() <= spacing * 1.0001)[finite].all()
    assert torch.equal(value[~finite & torch.isinf(x)], down[~finite & torch.isinf(x)])


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_stochastic_rounding_is_unbiased_over_many_keys(dtype):
    """Each value rounded under 4,000 (step) keys: the mean lands within 4 standard errors of
    the value, where nearest rounding's error is the whole bias."""
    rng = np.random.default_rng(1)
    v = (rng.normal(0, 1, 64) * 0.37).astype(np.float32).reshape(1, -1)
    draws = np.stack([widened(rounded(v, np.array([11]), 0, step, dtype, "stochastic"), dtype)[0]
                      for step in range(4000)]).astype(np.float64)
    x = v[0].astype(np.float64)
    err = draws.mean(0) - x
    se = draws.std(0) / np.sqrt(draws.shape[0])
    assert (np.abs(err) <= 4 * se + 1e-12).all(), (err, se)
    nearest = widened(rounded(v, np.array([11]), 0, 0, dtype, "nearest"), dtype)[0] - x
    assert np.abs(err).mean() < 0.2 * np.abs(nearest).mean()
