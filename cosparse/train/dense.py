"""The dense side of a run: the device it computes on and the dense parameters' optimizer."""

from __future__ import annotations

import torch

from cosparse.config import Config, ConfigError


def pick_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device: 'cuda' requested but no CUDA device is available")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def make_dense_optimizer(cfg: Config, params) -> torch.optim.Optimizer:
    """The dense parameters' optimizer; an unknown ``model.dense_optimizer.kind`` is refused.

    ``weight_decay``: adagrad and sgd add ``weight_decay * w`` to the gradient (torch's L2
    term); adam decays the weights decoupled from its adaptive step, as AdamW (Loshchilov and
    Hutter), which is what a decay on Adam usually means. Without decay adam is torch's Adam."""
    o = cfg.model.dense_optimizer
    kinds = {"adagrad": torch.optim.Adagrad, "sgd": torch.optim.SGD,
             "adam": torch.optim.AdamW if o.weight_decay else torch.optim.Adam}
    if o.kind not in kinds:
        raise ConfigError(f"model.dense_optimizer.kind: {o.kind!r} is not one of "
                          f"{', '.join(map(repr, kinds))}")
    return kinds[o.kind](params, lr=o.lr, weight_decay=o.weight_decay)


def warm_up_vector_math() -> None:
    """Run torch's vectorised unary math (sqrt, rsqrt, exp, log, ...) once on one thread.

    The first parallel call of such an op initialises its vector-math dispatch lazily; seen here
    as a race, on rare runs, in which the second thread's half of the first dense Adagrad step's
    ``state_sum.sqrt()`` came out wrong (``tests/test_bench_ps_smoke.py``, about 1 run in 20).
    Initialising it once on a single thread before any pool runs it avoids that: 0 failures in 30
    runs against 4 in 46 without."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x = torch.full((64,), 2.0)
        for op in (torch.sqrt, torch.rsqrt, torch.exp, torch.log, torch.sigmoid, torch.tanh,
                   torch.reciprocal):
            op(x)
        torch.addcdiv(x, x, x.sqrt().add_(1e-10), value=-0.1)
    finally:
        torch.set_num_threads(threads)
