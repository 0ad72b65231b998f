"""Tier sizing at start-up: dense first, sparse the rest.

The dense model's need (parameters, gradients, optimizer state and activations) is measured from a
dry-run step: ``torch.cuda.max_memory_allocated`` on CUDA, the sizes of the tensors autograd saves
on CPU. The sparse tiers share what is left, split across tables by their observed demand
(unique rows per batch in the first batches). A budget that cannot hold the dense model, or a
device tier that cannot hold one batch's unique rows, is a configuration error.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cosparse.batch import SparseBatch
from cosparse.config import Config, ConfigError
from cosparse.config.objective import ObjectiveConfig, objective_of
from cosparse.nn.embedding import EmbeddingCollection
from cosparse.nn.engine_model import EngineModel
from cosparse.optim import state_width
from cosparse.store.types import TierPlan
from cosparse.train.objective import objective_loss

_DENSE_OPT_STATE = {"sgd": 0, "adagrad": 1, "adam": 2}


@dataclass
class SizingReport:
    dense_bytes: int
    unique_per_batch: dict[str, int]  # max over the probe batches
    plans: dict[str, TierPlan]


def measure_dense_bytes(model: EngineModel, batch: SparseBatch, opt_kind: str,
                        objective: ObjectiveConfig | None = None) -> int:
    """Bytes the dense model needs for one training step, the loss ``objective``'s (None: one
    binary task); the model's state is left unchanged."""
    params = list(model.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    state_bytes = param_bytes * _DENSE_OPT_STATE[opt_kind]
    device = next(iter(params)).device if params else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    saved = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    unplaced = model.ec is None  # (a user's model: its collection is placed later)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = (model.dry_forward(batch, device) if unplaced  # type: ignore[operator]
                  else model(model.ec.prepare_and_stage(batch)))
        loss = objective_loss(objective_of(objective), logits, batch, device, observe=False)
    loss.backward()
    if not unplaced:
        model.ec._pending = []  # the dry run trains nothing
    for p in params:
        p.grad = None
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - base
        return int(peak + state_bytes)
    return int(param_bytes * 2 + state_bytes + saved)  # params + grads + state + activations


def size_tiers(cfg: Config, probe: list[SparseBatch], dense_bytes: int) -> SizingReport:
    """Per-table device/host capacities from the config, the dense need and the probe batches."""
    ec = EmbeddingCollection(cfg.tables, device="cpu")  # only its ID prep is used here
    unique = {t.name: 0 for t in cfg.tables}
    for b in probe:
        for name, tids in ec.prepare(b).tables.items():
            unique[name] = max(unique[name], tids.num_unique)
    row_bytes = {
        t.name: 4 * (t.dim + state_width(t.optimizer.kind, t.dim)) for t in cfg.tables
    }
    demand = {n: max(1, unique[n]) * row_bytes[n] for n in unique}
    total_demand = sum(demand.values())
    dev, host = cfg.store.device, cfg.store.host

    def split(budget: int) -> dict[str, int]:
        return {n: int(budget * demand[n] / total_demand) // row_bytes[n] for n in demand}

    if dev.rows is not None:
        device_rows = {n: dev.rows for n in unique}
    else:
        sparse = int(dev.budget_bytes) - dense_bytes  # type: ignore[arg-type]
        if sparse <= 0:
            raise ConfigError(
                f"store.device.budget_bytes: {dev.budget_bytes} bytes cannot hold the dense model, "
                f"which needs {dense_bytes} bytes (parameters, optimizer state, activations)"
            )
        device_rows = split(sparse)
    if host.rows is not None:
        host_rows: dict[str, int | None] = {n: host.rows for n in unique}
    elif host.budget_bytes is not None:
        host_rows = dict(split(int(host.budget_bytes)))
    else:
        host_rows = {n: None for n in unique}
    plans = {}
    for t in cfg.tables:
        n = t.name
        if device_rows[n] < unique[n]:
            raise ConfigError(
                f"store.device: table '{n}' gets {device_rows[n]} device rows but one batch of the "
                f"first {len(probe)} needs {unique[n]} unique rows"
            )
        if host_rows[n] is not None and host_rows[n] < device_rows[n]:  # type: ignore[operator]
            raise ConfigError(
                f"store.host: table '{n}' gets {host_rows[n]} host rows, fewer than its "
                f"{device_rows[n]} device rows; the host tier must be at least as large"
            )
        plans[n] = TierPlan(
            device_rows=int(device_rows[n]), host_rows=host_rows[n], spill=host.spill,
            device_policy=t.policy or dev.policy, host_policy=host.policy, decay=cfg.store.decay,
            ttl_steps=cfg.store.ttl_steps,
        )
    return SizingReport(dense_bytes, unique, plans)


def describe(report: SizingReport) -> str:
    parts = [
        f"{n}: device {p.device_rows} rows, host {p.host_rows or 'unbounded'}"
        + (" + spill" if p.spill else "")
        for n, p in report.plans.items()
    ]
    return f"tiers (dense needs {report.dense_bytes / 2**20:.1f} MiB): " + "; ".join(parts)
