"""A ``torch.export`` program of a user's model (``model.factory``), the lookup outside it.

The program takes what the model's ``EmbeddingBagCollection``s would have looked up: the dense
inputs ``[B, n]``, each pooled feature's rows ``[B, dim]`` and each ``pooling: none`` feature's
``(values [N, dim], offsets [B + 1])``; it returns ``{task: Tensor[B]}``, the model's outputs
(one task: ``{"label": logits}``). Inside, the model's forward runs on a ``ServedBatch``, whose
collections hand back those inputs instead of looking anything up.

A model exports when its forward reads only ``dense`` and its collections' lookups: one that
reads ``batch.sparse``, ``labels`` or ``weights``, or that torch.export cannot trace, falls back
to its state_dict, and the manifest's ``why`` says what failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from cosparse.nn.collections import Collections
from cosparse.nn.engine_model import logits_of, task_outputs
from cosparse.nn.model_batch import Batch
from cosparse.nn.types import Jagged

PROGRAM_FILE = "program.pt2"


class ServedBatch(Batch):
    """A batch of serving inputs: ``dense`` and the lookups, nothing else."""

    def __init__(self, dense: torch.Tensor, lookups: dict[str, Any]) -> None:
        self.device = dense.device
        self._dense = dense
        self._lookups = lookups
        self.weights = None

    @property
    def batch_size(self) -> int:
        return self._dense.shape[0]  # (not int(): a symbolic size while exporting)

    @property
    def dense_keys(self) -> list[str] | None:
        return None

    @property
    def labels(self) -> dict[str, torch.Tensor]:
        raise AttributeError("a served batch has no labels: the model's forward must not read "
                             "batch.labels to be exported")

    @property
    def sparse(self) -> Any:  # type: ignore[override]
        raise AttributeError("a served batch has no IDs (the lookup is outside the program): "
                             "the model's forward must not read batch.sparse to be exported")

    def looked_up(self, engine: Any) -> dict[str, Any]:
        return self._lookups


class _Served(nn.Module):
    """What the collections are placed on while the program runs: nothing looks up."""


class DenseProgram(nn.Module):
    """The user's ``model`` with its lookups as inputs (see the module's docstring)."""

    def __init__(self, model: nn.Module, pooled: list[str], jagged: list[str],
                 tasks: list[str] | None) -> None:
        super().__init__()
        self.model = model
        self.pooled, self.jagged, self.tasks = pooled, jagged, tasks
        Collections(model).place(_Served())

    def forward(self, dense: torch.Tensor, pooled: tuple[torch.Tensor, ...],
                jagged: tuple[tuple[torch.Tensor, torch.Tensor], ...]) -> dict[str, torch.Tensor]:
        lookups: dict[str, Any] = dict(zip(self.pooled, pooled, strict=True))
        for f, (values, offsets) in zip(self.jagged, jagged, strict=True):
            lookups[f] = Jagged(values, offsets[1:] - offsets[:-1], offsets)
        out = self.model(ServedBatch(dense, lookups))
        b = dense.shape[0]  # (symbolic while exporting: int() would pin it)
        if self.tasks is None:
            return {"label": logits_of(out, b)}
        return task_outputs(out, self.tasks, b)


def export_model_program(model: nn.Module, tasks: list[str] | None, num_dense: int,
                         path: Path) -> dict[str, Any]:
    """Export ``model`` (its dense state loaded, in eval mode) to ``path``; the manifest's
    ``inputs``: the number of dense inputs, the pooled and the jagged features in order."""
    tables = Collections(model).tables
    pooled = [f for t in tables if t.pooling != "none" for f in t.features]
    jagged = [f for t in tables if t.pooling == "none" for f in t.features]
    dim = {f: t.dim for t in tables for f in t.features}
    program = DenseProgram(model, pooled, jagged, tasks)
    b, n = 3, 5  # (example sizes: none 0 or 1, which torch.export would specialise on)
    batch = torch.export.Dim("batch", min=1)
    example = (torch.zeros(b, num_dense), tuple(torch.zeros(b, dim[f]) for f in pooled),
               tuple((torch.zeros(n, dim[f]), torch.tensor([0, 2, 2, n])) for f in jagged))
    # a jagged feature's rows: AUTO, so that features the model concatenates (one history's
    # items and categories) are found to share their length instead of failing the export
    shapes = ({0: batch}, tuple({0: batch} for _ in pooled),
              tuple(({0: torch.export.Dim.AUTO}, {0: batch + 1}) for _ in jagged))
    exported = torch.export.export(program, example, dynamic_shapes=shapes)
    torch.export.save(exported, path)
    return {"num_dense": num_dense, "features": pooled, "jagged": jagged}


class ProgramModel(nn.Module):
    """An exported program over an embedding collection: the lookup, then the program on the
    dense inputs and the lookups (``inputs``: the manifest's). A built-in model's program
    (``inputs`` without ``jagged``) takes the pooled rows only and returns logits."""

    def __init__(self, program: Any, ec: nn.Module, inputs: dict[str, Any]) -> None:
        super().__init__()
        self.ec = ec
        self.features: list[str] = inputs["features"]
        self.jagged: list[str] | None = inputs.get("jagged")
        self._program = [program]  # (not a submodule: an exported program has no eval mode)

    def forward(self, prepared: Any) -> Any:
        looked = self.ec(prepared)
        dense = prepared.batch.dense
        pooled = tuple(looked[f] for f in self.features)
        if self.jagged is None:  # (a built-in model's program: cosparse.serving.dense)
            return self._program[0](dense, pooled)
        jagged = tuple((looked[f].values, looked[f].offsets) for f in self.jagged)
        return self._program[0](dense, pooled, jagged)
