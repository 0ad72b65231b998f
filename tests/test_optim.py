"""The sparse-optimizer family: numba kernels against a float64 reference and the torch path."""

import numpy as np
import pytest
import torch

from cosparse.config import OptimizerConfig
from cosparse.optim import SparseOptimizer

KINDS = ["sgd", "adagrad", "rowwise_adagrad", "adam"]


def _reference(kind, w, s, g, step, lr, eps, b1=0.9, b2=0.999, l2=0.0):
    w, s, g = (x.astype(np.float64) for x in (w, s, g))
    g = g + l2 * w
    dim = w.shape[1]
    if kind == "sgd":
        return w - lr * g, s
    if kind == "adagrad":
        s = s + g * g
        return w - lr * g / (np.sqrt(s) + eps), s
    if kind == "rowwise_adagrad":
        s = s + (g * g).mean(axis=1, keepdims=True)
        return w - lr * g / (np.sqrt(s) + eps), s
    m = b1 * s[:, :dim] + (1 - b1) * g
    v = b2 * s[:, dim:] + (1 - b2) * g * g
    w = w - lr * (m / (1 - b1**step)) / (np.sqrt(v / (1 - b2**step)) + eps)
    return w, np.concatenate([m, v], axis=1)


@pytest.mark.parametrize("l2", [0.0, 0.05])
@pytest.mark.parametrize("kind", KINDS)
def test_kernel_matches_reference_and_writes_back_side_by_side(kind, l2):
    rng = np.random.default_rng(0)
    opt = SparseOptimizer(OptimizerConfig(kind=kind, lr=0.1, eps=1e-6, l2=l2))
    dim, n_rows, u = 8, 50, 20
    sw = opt.state_width(dim)
    slab = rng.normal(size=(n_rows, dim + sw)).astype(np.float32)
    slab[:, dim:] = np.abs(slab[:, dim:])
    slots = rng.choice(n_rows, u, replace=False).astype(np.int64)
    w = np.ascontiguousarray(slab[slots, :dim])
    s = np.ascontiguousarray(slab[slots, dim:])
    g = rng.normal(size=(u, dim)).astype(np.float32)
    before = slab.copy()
    opt.update(w, s, g, 3, slab, slots)
    rw, rs = _reference(kind, w, s, g, 3, 0.1, 1e-6, l2=l2)
    np.testing.assert_allclose(slab[slots, :dim], rw, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(slab[slots, dim:], rs, rtol=1e-5, atol=1e-6)
    untouched = np.setdiff1d(np.arange(n_rows), slots)
    assert np.array_equal(slab[untouched], before[untouched])


@pytest.mark.parametrize("l2", [0.0, 0.05])
@pytest.mark.parametrize("kind", KINDS)
def test_torch_path_agrees_with_numba(kind, l2):
    """The torch ops (used on CUDA) agree with the numba kernel to float32 rounding."""
    rng = np.random.default_rng(1)
    opt = SparseOptimizer(OptimizerConfig(kind=kind, lr=0.05, l2=l2))
    dim = 16
    sw = opt.state_width(dim)
    slab = np.abs(rng.normal(size=(30, dim + sw))).astype(np.float32)
    slots = np.arange(0, 30, 3, dtype=np.int64)
    w, s = slab[slots, :dim].copy(), slab[slots, dim:].copy()
    g = rng.normal(size=(slots.shape[0], dim)).astype(np.float32)
    a = slab.copy()
    opt.update(w, s, g, 5, a, slots)
    b = torch.from_numpy(slab.copy())
    opt.update(torch.from_numpy(w), torch.from_numpy(s), torch.from_numpy(g), 5, b, torch.from_numpy(slots))
    np.testing.assert_allclose(a, b.numpy(), rtol=1e-5, atol=1e-6)


def test_kernel_is_independent_of_thread_count():
    import numba

    rng = np.random.default_rng(3)
    opt = SparseOptimizer(OptimizerConfig(kind="rowwise_adagrad", lr=0.1))
    slab = rng.normal(size=(5000, 33)).astype(np.float32)
    slab[:, 32] = 0
    slots = rng.permutation(5000)[:4000].astype(np.int64)
    w, s = slab[slots, :32].copy(), slab[slots, 32:].copy()
    g = rng.normal(size=(4000, 32)).astype(np.float32)
    outs = []
    for threads in (1, numba.config.NUMBA_NUM_THREADS):
        numba.set_num_threads(threads)
        dest = slab.copy()
        opt.update(w, s, g, 1, dest, slots)
        outs.append(dest)
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    assert np.array_equal(outs[0], outs[1])


def _l2_decay_reference(kind, w, s, lr, eps, l2, step, b1=0.9, b2=0.999):
    """One update of rows whose loss gradient is zero, written out by hand in float32 torch:
    the gradient the rule sees is l2 * w alone."""
    g = l2 * w
    dim = w.shape[1]
    if kind == "sgd":
        return w - lr * g
    if kind == "adagrad":
        return w - lr * g / ((s + g * g).sqrt() + eps)
    if kind == "rowwise_adagrad":
        acc = s + (g * g).sum(dim=1, keepdim=True) / dim
        return w - lr * g / (acc.sqrt() + eps)
    m = b1 * s[:, :dim] + (1 - b1) * g
    v = b2 * s[:, dim:] + (1 - b2) * g * g
    return w - lr * (m / (1 - b1**step)) / ((v / (1 - b2**step)).sqrt() + eps)


@pytest.mark.parametrize("kind", KINDS)
def test_l2_decays_touched_rows_with_zero_gradient_as_the_rule_says(kind):
    """tables[*].optimizer.l2: a touched row whose gradient is zero moves towards 0 by exactly
    the rule's step on l2 * w; without l2 it stays put, and untouched rows never move."""
    rng = np.random.default_rng(4)
    dim, n_rows, lr, l2, step = 8, 40, 0.01, 0.5, 2
    w0 = (rng.uniform(0.5, 1.0, size=(n_rows, dim)) * rng.choice([-1, 1], size=(n_rows, dim)))
    slots = np.arange(0, n_rows, 2, dtype=np.int64)
    out = {}
    for reg in (0.0, l2):
        opt = SparseOptimizer(OptimizerConfig(kind=kind, lr=lr, l2=reg))
        slab = np.zeros((n_rows, dim + opt.state_width(dim)), dtype=np.float32)
        slab[:, :dim] = w0
        w = np.ascontiguousarray(slab[slots, :dim])
        s = np.ascontiguousarray(slab[slots, dim:])
        opt.update(w, s, np.zeros_like(w), step, slab, slots)
        out[reg] = slab
    untouched = np.setdiff1d(np.arange(n_rows), slots)
    w32 = w0.astype(np.float32)
    for slab in out.values():
        assert np.array_equal(slab[untouched, :dim], w32[untouched])
    assert np.array_equal(out[0.0][slots, :dim], w32[slots])  # no gradient, no l2: no move
    got = out[l2][slots, :dim]
    assert (np.abs(got) < np.abs(w32[slots])).all() and (np.sign(got) == np.sign(w32[slots])).all()
    ref = _l2_decay_reference(kind, torch.from_numpy(w32[slots]),
                              torch.zeros(slots.shape[0], out[l2].shape[1] - dim), lr, 1e-8, l2,
                              step)
    np.testing.assert_allclose(got, ref.numpy(), rtol=2e-6, atol=0)


@pytest.mark.parametrize("l2", [0.0, 0.05])
def test_rowwise_adagrad_four_rows_at_a_time_is_one_at_a_time_bit_for_bit(l2):
    """The batch kernel takes row-wise Adagrad's rows four at a time (a quad with a row not
    admitted, and a tail of three, go one at a time): every row as the one-row update makes it."""
    rng = np.random.default_rng(1)
    opt = SparseOptimizer(OptimizerConfig(kind="rowwise_adagrad", lr=0.1, eps=1e-6, l2=l2))
    dim, n_rows, u = 64, 100, 23
    slab = rng.normal(size=(n_rows, dim + 1)).astype(np.float32)
    slab[:, dim] = np.abs(slab[:, dim])
    slots = rng.choice(n_rows, u, replace=False).astype(np.int64)
    slots[9] = -1  # not admitted: trains nothing
    w = np.ascontiguousarray(slab[np.maximum(slots, 0), :dim])
    s = np.ascontiguousarray(slab[np.maximum(slots, 0), dim:])
    g = rng.normal(size=(u, dim)).astype(np.float32)
    batch, alone = slab.copy(), slab.copy()
    opt.update(w, s, g, 1, batch, slots)
    for i in range(u):
        opt.update(w[i : i + 1], s[i : i + 1], g[i : i + 1], 1, alone, slots[i : i + 1])
    assert np.array_equal(batch, alone)
    untouched = np.setdiff1d(np.arange(n_rows), slots)
    assert np.array_equal(batch[untouched], slab[untouched])
