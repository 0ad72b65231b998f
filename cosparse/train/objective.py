"""The objective's loss: per task, binary cross-entropy with logits, or MSE / Huber, times each
sample's weight, on the samples its mask keeps; summed over the samples and divided by the global
batch size (never normalised per rank); the total is the tasks' weighted sum.

The default objective (one binary task ``label``, no weights) is computed exactly as before
objectives existed (``binary_cross_entropy_with_logits``'s mean; ``global_bce`` on many ranks),
so its losses keep their bits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cosparse.batch import SparseBatch
from cosparse.config.objective import ObjectiveConfig
from cosparse.parallel.loss import global_bce, global_sum, retrieval_loss
from cosparse.parallel.world import World

Outputs = torch.Tensor | dict[str, torch.Tensor]


def task_labels(batch: SparseBatch) -> dict[str, torch.Tensor]:
    """Each task's labels (the one task ``label`` unless the batch has several)."""
    return batch.task_labels if batch.task_labels is not None else {"label": batch.labels}


def task_predictions(objective: ObjectiveConfig, outputs: Outputs) -> dict[str, torch.Tensor]:
    """What each task predicts from the model's outputs, float32: a binary task's probability
    (the sigmoid of its logit), a regression's value. Evaluation records these and serving
    returns them, both through this function, so the two agree bit for bit."""
    if not isinstance(outputs, dict):
        outputs = {"label": outputs}
    return {name: (torch.sigmoid(outputs[name]) if task.kind == "binary"
                   else outputs[name]).float() for name, task in objective.tasks.items()
            if task.kind != "retrieval"}  # (a retrieval task is scored by ranking the corpus)


def per_sample(kind_loss: str, delta: float, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One task's loss per sample."""
    if kind_loss == "bce":
        return F.binary_cross_entropy_with_logits(x, y, reduction="none")
    if kind_loss == "mse":
        return F.mse_loss(x, y, reduction="none")
    return F.huber_loss(x, y, reduction="none", delta=delta)


def objective_loss(objective: ObjectiveConfig, outputs: Outputs, batch: SparseBatch,
                   device: torch.device, world: World | None = None,
                   sizes: list[int] | None = None, observe: bool = True) -> torch.Tensor:
    """The loss of ``outputs`` (logits [B], or per task) on ``batch``: the global batch's on
    many ranks (``world``; ``sizes``: each rank's samples, None: asked of the ranks).
    ``observe``: a retrieval task counts the batch's items in its frequency estimate (a
    training step's loss; not a dry run's)."""
    if objective.default and batch.weights is None:
        logits = outputs["label"] if isinstance(outputs, dict) else outputs
        labels = batch.labels.to(device, non_blocking=True)
        if world is not None:
            return global_bce(logits, labels, sizes, world)
        return F.binary_cross_entropy_with_logits(logits, labels)
    if not isinstance(outputs, dict):
        outputs = {"label": outputs}
    labels = {k: v.to(device, non_blocking=True) for k, v in task_labels(batch).items()}
    weights = None if batch.weights is None else batch.weights.to(device, non_blocking=True)
    total = None
    for name, task in objective.tasks.items():
        if task.kind == "retrieval":  # (the objective's only task)
            total = retrieval_loss(outputs[name], task.temperature, world, sizes,
                                   observe, batch.negative_pool) * task.weight
            continue
        x = outputs[name]
        losses = per_sample(task.loss_name, task.delta, x, labels[name].to(x.dtype))
        if weights is not None:
            losses = losses * weights
        if task.mask is not None:
            losses = losses * labels[task.mask].to(x.dtype)
        part = losses.sum() * task.weight
        total = part if total is None else total + part
    assert total is not None
    if world is not None:
        return global_sum(total, batch.batch_size, sizes, world)
    return total / batch.batch_size
