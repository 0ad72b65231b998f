"""The all-resident placement of a model's tables: each table's share of a device budget, and
its table (``FixedVocabTable`` for ``vocab: fixed``, else a dynamic ``ResidentTable``)."""

from __future__ import annotations

import torch

from cosparse.config import ConfigError, TableConfig
from cosparse.optim import state_width
from cosparse.store.fixed_vocab import FixedVocabTable
from cosparse.store.resident import ResidentTable


def budget_shares(tables: list[TableConfig], budget: int) -> dict[str, int]:
    """Split a device budget by declared row bytes (a fixed vocabulary's ``hash_size`` rows);
    fail at start-up if declared sizes overflow it."""
    need = {
        t.name: ((t.hash_size if t.vocab == "fixed" else t.num_embeddings) or 0)
        * 4 * (t.dim + state_width(t.optimizer.kind, t.dim))
        for t in tables
    }
    total = sum(need.values())
    if total > budget:
        raise ConfigError(
            f"store.device.budget_bytes: {budget} bytes cannot hold the declared tables "
            f"({total} bytes: " + ", ".join(f"{k}={v}" for k, v in need.items()) + ")"
        )
    spare = (budget - total) // max(len(tables), 1)  # a rank may hold no table
    return {name: n + spare for name, n in need.items()}


def resident_tables(tables: list[TableConfig], device: torch.device,
                    budget_bytes: int | None = None) -> dict[str, ResidentTable]:
    """Every table all-resident on ``device``, each in its share of ``budget_bytes`` if given."""
    share = budget_shares(tables, budget_bytes) if budget_bytes is not None else {}
    return {t.name: resident_table(t, device, share.get(t.name)) for t in tables}


def resident_table(cfg: TableConfig, device: torch.device, max_bytes: int | None = None
                   ) -> ResidentTable:
    """An all-resident table: a ``FixedVocabTable`` for ``vocab: fixed``, else dynamic."""
    if cfg.vocab == "fixed":
        return FixedVocabTable(cfg, device, max_bytes)
    return ResidentTable(cfg, device, max_bytes)
