"""Table placements for the supply paths: which class holds each table's rows.

``tiered_tables``: the tables with a tier plan in a device tier over a host tier (and below it an
in-process spill store, or the remote PS); the others all-resident. ``ps_tables``: architecture
A, every row on the PS, with a write-through device cache for the tables with a tier plan.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from cosparse.config import ConfigError, TableConfig
from cosparse.ps import PSClient
from cosparse.store.all_resident import resident_table
from cosparse.store.remote_batch import RemoteBatch
from cosparse.store.tiered import TieredTable
from cosparse.store.types import RemoteRows, TablePlacement, TierPlan
from cosparse.supply.ps_direct import PSCachedTable, PSDirectTable


def tiered_tables(tables: list[TableConfig], device: torch.device, plans: dict[str, TierPlan],
                  remote: RemoteRows | None = None,
                  on_queued: Callable[[str, np.ndarray], None] | None = None,
                  ) -> dict[str, TablePlacement]:
    """Tiers for the tables ``plans`` names (``remote``: the PS below a spilling host tier,
    which every table's plan reaches through one ``RemoteBatch``; ``on_queued``: told of each
    write-back it queues)."""
    out: dict[str, TablePlacement] = {}
    batched = RemoteBatch(remote, on_queued) if remote is not None else None
    for t in tables:
        p = plans.get(t.name)
        if p is None:
            out[t.name] = resident_table(t, device)
            continue
        out[t.name] = TieredTable(
            t, device, p.device_rows, p.host_rows, p.spill, p.device_policy, p.host_policy,
            p.decay, p.ttl_steps, remote=batched if p.spill else None,
        )
    return out


def ps_tables(tables: list[TableConfig], device: torch.device, client: PSClient, lookahead: int,
              plans: dict[str, TierPlan] | None = None, check_versions: bool = False,
              ) -> dict[str, TablePlacement]:
    """Architecture A: each table on the PS; a table with a tier plan gets a device cache."""
    out: dict[str, TablePlacement] = {}
    for t in tables:
        p = (plans or {}).get(t.name)
        if p is None:
            table: PSDirectTable | PSCachedTable = PSDirectTable(t, device, client, lookahead)
        elif p.host_rows is not None or p.spill:
            raise ConfigError("store.host: supply.path 'ps-direct' has no host tier")
        else:
            table = PSCachedTable(t, device, client, p.device_rows, p.device_policy, p.decay)
        table.check_versions = check_versions
        out[t.name] = table
    return out
