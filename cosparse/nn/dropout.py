"""Dropout for the dense towers whose masks are a pure function of (run seed, rank, step).

``torch.nn.Dropout`` draws from torch's global generator, which anything else in the process
may also draw from (a placement, a planner thread, a probe batch), so its masks, and with them
every loss, could depend on where the rows live. Here a model's towers share one
``TowerDropout``: its rate, and generators of its own (one per device) that the trainer re-seeds
before each training step from the run's seed, the rank and the step. Its ``SeededDropout``
layers draw their masks from them in forward order. The masks are then the same on every
placement and supply path, and a resumed run draws the masks an uninterrupted run would have
drawn. Dropout is off in eval mode (``model.eval()``).

A model on the public API (``cosparse.models``) may build its ``TowerDropout`` without a seed:
the trainer that trains it finds its ``SeededDropout`` layers by type (``step_dropout``) and
seeds their masks from the run's ``train.seed``, as it does a built-in model's.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class TowerDropout:
    """One model's dropout: the rate ``p`` and the generators its layers draw masks from.
    ``seed``: the masks' seed (None: the seed of the run that trains the model, ``train.seed``)."""

    def __init__(self, p: float, seed: int | None = None) -> None:
        if not 0.0 <= p < 1.0:
            raise ValueError(f"model.dropout: must be in [0, 1), got {p}")
        self.p = float(p)
        self.seed = None if seed is None else int(seed)
        self._generators: dict[torch.device, torch.Generator] = {}
        self._step_seed = 0
        self.begin_step(0)

    def begin_step(self, step: int, rank: int = 0, run_seed: int = 0) -> None:
        """Seed the masks of training step ``step`` (1-based) on ``rank``; ``run_seed``: the
        run's seed, used when this dropout has none of its own."""
        seed = self.seed if self.seed is not None else int(run_seed)
        state = np.random.SeedSequence([seed, int(rank), int(step)]).generate_state(
            1, np.uint64)
        self._step_seed = int(state[0])
        for g in self._generators.values():
            g.manual_seed(self._step_seed)

    def generator(self, device: torch.device) -> torch.Generator:
        """The generator of ``device``, seeded for the current step."""
        g = self._generators.get(device)
        if g is None:
            g = self._generators[device] = torch.Generator(device=device)
            g.manual_seed(self._step_seed)
        return g

    def layer(self) -> SeededDropout:
        """A dropout layer for a tower, drawing from this model's generators."""
        return SeededDropout(self)


class SeededDropout(nn.Module):
    """Inverted dropout (kept activations scaled by 1 / (1 - p)) with a ``TowerDropout``'s masks."""

    def __init__(self, source: TowerDropout) -> None:
        super().__init__()
        self.source = source

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.source.p
        if not self.training or p == 0.0:
            return x
        keep = torch.empty_like(x).bernoulli_(1.0 - p, generator=self.source.generator(x.device))
        return x * keep.mul_(1.0 / (1.0 - p))

    def extra_repr(self) -> str:
        return f"p={self.source.p}"


class StepDropout:
    """Every ``TowerDropout`` of a model, seeded together at each step from the run's seed."""

    def __init__(self, sources: list[TowerDropout], run_seed: int) -> None:
        self.sources = sources
        self.run_seed = int(run_seed)

    def begin_step(self, step: int, rank: int = 0) -> None:
        """Seed the masks of training step ``step`` (1-based) on ``rank``."""
        for source in self.sources:
            source.begin_step(step, rank, self.run_seed)


def step_dropout(model: nn.Module, run_seed: int) -> StepDropout | None:
    """The tower dropout of ``model``'s ``SeededDropout`` layers, found by type (None: none)."""
    sources: dict[int, TowerDropout] = {}
    for module in model.modules():
        if isinstance(module, SeededDropout):
            sources.setdefault(id(module.source), module.source)
    return StepDropout(list(sources.values()), run_seed) if sources else None
