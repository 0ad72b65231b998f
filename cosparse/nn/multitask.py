"""Multi-task layers over one shared input: MMoE's gated experts, PLE's customised gate control
(CGC) and per-task towers, as plain ``nn.Module`` s a user's model can hold.

* ``MMoE`` (Ma et al., KDD 2018): ``experts`` shared expert MLPs; each task mixes their outputs
  with a softmax gate of its own over the input.
* ``CGC`` (Tang et al., RecSys 2020, PLE's extraction layer): each task has experts of its own
  besides the shared ones, and its gate mixes only its own and the shared; ``PLE`` stacks
  ``levels`` of them, a shared gate mixing every expert into the next level's shared input.
* ``TaskTowers``: one MLP per task to one output (a binary task's logit, a regression's value).

Every layer is a fixed sequence of torch operations with no randomness but the towers' seeded
dropout (``cosparse.nn.dropout``), so a model built from them trains bit-identically on every
placement.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from cosparse.nn.dropout import TowerDropout
from cosparse.nn.towers import mlp


def _experts(width: int, count: int, layers: Sequence[int], dropout: TowerDropout | None
             ) -> nn.ModuleList:
    """``count`` expert MLPs ``width -> layers``, ReLU after every layer."""
    return nn.ModuleList(mlp([width, *layers], last_activation=True, dropout=dropout)
                         for _ in range(count))


def mix(gate_logits: torch.Tensor, experts: list[torch.Tensor]) -> torch.Tensor:
    """The experts' outputs ([B, D] each) weighted by the softmax of ``gate_logits`` [B, E]."""
    weights = torch.softmax(gate_logits, dim=1).unsqueeze(1)  # [B, 1, E]
    return torch.bmm(weights, torch.stack(experts, dim=1)).squeeze(1)


class MMoE(nn.Module):
    """Shared experts, one softmax gate per task; ``forward(x)`` gives each task's mixture
    [B, layers[-1]]."""

    def __init__(self, width: int, tasks: Sequence[str], experts: int, layers: Sequence[int],
                 dropout: TowerDropout | None = None) -> None:
        super().__init__()
        self.experts = _experts(width, experts, layers, dropout)
        self.gates = nn.ModuleDict({t: nn.Linear(width, experts) for t in tasks})
        self.out_dim = layers[-1]

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        outs = [e(x) for e in self.experts]
        return {t: mix(gate(x), outs) for t, gate in self.gates.items()}


class CGC(nn.Module):
    """One PLE extraction layer: ``specific`` experts per task and ``shared`` experts; task t's
    gate mixes its own and the shared experts over its input; with ``shared_out`` a shared gate
    mixes every expert over the shared input, for the next layer."""

    def __init__(self, width: int, tasks: Sequence[str], shared: int, specific: int,
                 layers: Sequence[int], dropout: TowerDropout | None, shared_out: bool) -> None:
        super().__init__()
        self.own = nn.ModuleDict({t: _experts(width, specific, layers, dropout) for t in tasks})
        self.shared = _experts(width, shared, layers, dropout)
        self.gates = nn.ModuleDict({t: nn.Linear(width, specific + shared) for t in tasks})
        self.shared_gate = (nn.Linear(width, len(tasks) * specific + shared) if shared_out
                            else None)

    def forward(self, inputs: dict[str, torch.Tensor], shared_in: torch.Tensor
                ) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        shared = [e(shared_in) for e in self.shared]
        own = {t: [e(inputs[t]) for e in experts] for t, experts in self.own.items()}
        out = {t: mix(gate(inputs[t]), own[t] + shared) for t, gate in self.gates.items()}
        if self.shared_gate is None:
            return out, None
        every = [o for t in self.own for o in own[t]] + shared
        return out, mix(self.shared_gate(shared_in), every)


class PLE(nn.Module):
    """``levels`` CGC layers; the first reads ``x`` for every task and for the shared experts,
    each next one the previous layer's outputs. ``forward(x)`` gives each task's output."""

    def __init__(self, width: int, tasks: Sequence[str], levels: int, shared: int,
                 specific: int, layers: Sequence[int], dropout: TowerDropout | None = None
                 ) -> None:
        super().__init__()
        widths = [width] + [layers[-1]] * (levels - 1)
        self.levels = nn.ModuleList(
            CGC(w, tasks, shared, specific, layers, dropout, shared_out=i < levels - 1)
            for i, w in enumerate(widths))
        self.tasks = list(tasks)
        self.out_dim = layers[-1]

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        inputs: dict[str, torch.Tensor] = dict.fromkeys(self.tasks, x)
        shared: torch.Tensor | None = x
        for level in self.levels:
            assert shared is not None
            inputs, shared = level(inputs, shared)
        return inputs


class TaskTowers(nn.Module):
    """One MLP per task, ``width -> layers -> 1``; ``forward({task: x})`` gives each task's
    output [B]."""

    def __init__(self, width: int, tasks: Sequence[str], layers: Sequence[int],
                 dropout: TowerDropout | None = None) -> None:
        super().__init__()
        self.towers = nn.ModuleDict(
            {t: mlp([width, *layers, 1], last_activation=False, dropout=dropout) for t in tasks})

    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {t: tower(inputs[t]).squeeze(-1) for t, tower in self.towers.items()}


def ctcvr_logit(ctr_logit: torch.Tensor, cvr_logit: torch.Tensor) -> torch.Tensor:
    """ESMM's CTCVR as a logit: log(p / (1 - p)) of p = sigmoid(ctr) * sigmoid(cvr), computed in
    log space (p is clamped below 1 - 1e-7, where the logit would be infinite)."""
    log_p = (nn.functional.logsigmoid(ctr_logit) + nn.functional.logsigmoid(cvr_logit)
             ).clamp(max=-1e-7)
    return log_p - torch.log(-torch.expm1(log_p))
