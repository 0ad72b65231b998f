"""What a training step does when its loss is NaN or infinite (``train.on_nonfinite``).

``stop`` (the default) raises ``NonFiniteLoss`` at that step, before any update is applied, so
the run ends there naming the step instead of training on to a NaN model. ``skip_batch`` applies
no update for the batch (neither sparse rows nor dense weights) and counts it.
"""

from __future__ import annotations


class NonFiniteLoss(RuntimeError):
    """A step's loss was NaN or infinite under ``train.on_nonfinite: stop``."""

    def __init__(self, step: int, loss: float, epoch: int, batch: int) -> None:
        self.step, self.loss, self.epoch, self.batch = step, loss, epoch, batch
        super().__init__(
            f"the loss is {loss} at step {step} (epoch {epoch}, batch {batch} of the epoch); "
            "stopped before applying its updates. Lower the learning rates "
            "(tables[*].optimizer.lr, model.dense_optimizer.lr), check the data, or set "
            "train.on_nonfinite: skip_batch to skip such batches"
        )
