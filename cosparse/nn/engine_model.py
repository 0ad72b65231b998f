"""The module the engine trains: a model on the public API (the user's, or a built-in one of
``cosparse.models``) behind the interface the internal trainer reads (``ec``, ``dropout``,
``forward(prepared) -> logits [B]``).

Its ``ec`` is the engine the model's ``EmbeddingBagCollection``s are placed on: setting it (what
the trainer does whenever it builds or rebuilds the collection) places every one of them. Its
``forward`` hands the user's model a ``cosparse.Batch`` and checks what comes back: a ``Tensor[B]`` (or
[B, 1]) of one task, or a dict of them naming the objective's tasks.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from cosparse.batch import SparseBatch
from cosparse.nn.collections import Collections
from cosparse.nn.dropout import step_dropout
from cosparse.nn.model_batch import Batch
from cosparse.nn.retrieval import Retrieval
from cosparse.nn.types import PreparedBatch


class EngineModel(nn.Module):
    """``model`` (the user's) as the internal trainer drives it."""

    def __init__(self, model: nn.Module, tasks: list[str] | None = None, seed: int = 0) -> None:
        """``tasks``: the objective's tasks, whose outputs ``forward`` returns by name (None:
        the one task's logits); ``seed``: the run's ``train.seed``, which seeds the masks of
        the model's tower dropout (``cosparse.nn.dropout``) when it has any."""
        super().__init__()
        self.model = model
        self.tasks = tasks
        self.dropout = step_dropout(model, seed)  # (re-seeded by the trainer every step)
        self._paths = Collections(model).paths

    @property
    def collections(self) -> Collections:
        """The model's collections (found again: a deep copy of this module holds copies)."""
        return Collections(self.model)

    @property
    def ec(self) -> Any:
        """The engine's embedding collection the model's EmbeddingBagCollections are placed on."""
        return self.model.get_submodule(self._paths[0])._engine

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "ec":  # the trainer (re)built its collection: place the model's on it
            self.collections.place(value)
            return
        super().__setattr__(name, value)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False
                        ) -> Any:
        """As ``nn.Module``'s; a built-in model's state written before the zoo moved onto the
        public API (its keys without this wrapper's ``model.`` prefix) is mapped on load."""
        if state_dict and not any(k.startswith("model.") for k in state_dict):
            state_dict = {f"model.{k}": v for k, v in state_dict.items()}
        return super().load_state_dict(state_dict, strict, assign)

    def dry_forward(self, batch: SparseBatch, device: torch.device) -> Any:
        """The outputs on ``batch`` with zeros for every lookup, before the collection is
        placed (the tiers' sizing measures the dense part's step with it)."""
        return _dry_outputs(self, batch, device)

    def forward(self, prepared: PreparedBatch) -> torch.Tensor | dict[str, torch.Tensor]:
        """The logits [B] of the user's model on ``prepared`` (several tasks: per task)."""
        batch = Batch(prepared, self.ec.device)
        out = self.model(batch)
        if self.tasks is None:
            return logits_of(out, batch.batch_size)
        return task_outputs(out, self.tasks, batch.batch_size)


def _dry_outputs(engine: EngineModel, batch: SparseBatch, device: torch.device) -> Any:
    with engine.collections.dry():
        out = engine.model(Batch(PreparedBatch(batch, {}), device))
    if engine.tasks is None:
        return logits_of(out, batch.batch_size)
    return task_outputs(out, engine.tasks, batch.batch_size)


def task_outputs(out: Any, tasks: list[str], batch_size: int) -> dict[str, torch.Tensor]:
    """Each task's output [B] from what a model's forward returned: a dict naming exactly the
    objective's ``tasks`` (a Tensor serves an objective of one task)."""
    if not isinstance(out, dict):
        if len(tasks) != 1:
            raise TypeError(f"the model's forward returned a {type(out).__name__}; the objective "
                            f"has tasks {tasks}: return a dict of one Tensor[B] per task")
        out = {tasks[0]: out}
    if sorted(out) != sorted(tasks):
        raise ValueError(f"the model's forward returned tasks {sorted(out)}; the objective's "
                         f"tasks (objective.tasks) are {sorted(tasks)}")
    return {t: _one(out[t], batch_size, t) for t in tasks}


def logits_of(out: Any, batch_size: int) -> torch.Tensor:
    """The one task's logits [B] from what a model's forward returned."""
    if isinstance(out, dict):
        if len(out) != 1 or "label" not in out:
            raise ValueError(
                f"the model's forward returned tasks {sorted(out)}; without an objective the one "
                "task is 'label' (several tasks: give cosparse.Trainer an objective, or the "
                "config an objective section)")
        out = out["label"]
    return _one(out, batch_size, "label")


def _one(out: Any, batch_size: int, task: str) -> Any:
    """One task's output as a float Tensor [B] (a [B, 1] one squeezed), or a retrieval task's
    ``Retrieval`` of B users and items."""
    if isinstance(out, Retrieval):
        if (out.users.dim() != 2 or out.users.shape != out.items.shape
                or out.users.shape[0] != batch_size or out.item_ids.shape != (batch_size,)):
            raise ValueError(f"the model's forward returned a Retrieval of users "
                             f"{tuple(out.users.shape)}, items {tuple(out.items.shape)} and "
                             f"item_ids {tuple(out.item_ids.shape)}; expected [{batch_size}, D], "
                             f"[{batch_size}, D] and [{batch_size}] (task '{task}')")
        return out
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"the model's forward must return a Tensor[B] for task '{task}', not a "
                        f"{type(out).__name__}")
    if out.dim() == 2 and out.shape[1] == 1:
        out = out.squeeze(1)
    if out.shape != (batch_size,) or not out.is_floating_point():
        raise ValueError(f"the model's forward returned {out.dtype} {tuple(out.shape)}; "
                         f"expected float logits of shape ({batch_size},) or ({batch_size}, 1) "
                         f"(task '{task}')")
    return out
