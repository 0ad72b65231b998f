"""Lazy modules (``torch.nn.LazyLinear`` and kin) materialised by one dry forward of the user's
model on the first training batch, with zeros for every lookup: before the trainer builds the
dense optimizer and the data-parallel wrapper, which need every parameter's shape.

Their initial values are drawn from torch's generator seeded with ``train.seed`` (forked: the
caller's generator is left as it was), so they are the same whatever the placement, the device
the trainer later moves the model to, or what drew numbers before.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from cosparse.batch import SparseBatch
from cosparse.nn.collections import Collections
from cosparse.nn.model_batch import Batch
from cosparse.nn.types import PreparedBatch


def lazy_names(model: nn.Module) -> list[str]:
    """The parameters and buffers of ``model`` that are not materialised yet."""
    return [n for n, t in [*model.named_parameters(), *model.named_buffers()] if is_lazy(t)]


def materialise(model: nn.Module, collections: Collections, batch: SparseBatch,
                seed: int) -> None:
    """One forward of ``model`` on ``batch`` in eval mode, without gradients, the lookups
    zeros (nothing is looked up or planned); raises when a lazy parameter is left."""
    placed = [t for t in model.parameters() if not is_lazy(t)]
    device = placed[0].device if placed else torch.device("cpu")
    was_training = model.training
    devices = [device] if device.type == "cuda" else []
    try:
        with collections.dry(), torch.random.fork_rng(devices=devices), torch.no_grad():
            torch.manual_seed(seed)
            model.eval()
            model(Batch(PreparedBatch(batch, {}), device))
    finally:
        model.train(was_training)
    left = lazy_names(model)
    if left:
        raise ValueError(f"the model's lazy parameters {left} are still unset after a forward "
                         "on the first batch: the forward must use every lazy module")
