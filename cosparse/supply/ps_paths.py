"""The supply paths over a PS that the trainer pulls from itself.

- ``PSDirectPath`` (``supply.path: ps-direct``, architecture A): every row on the PS; the trainer
  pulls each batch's rows and pushes the gradients, optionally through a write-through device
  cache.
- ``RemoteTierPath`` (``supply.path: ps-tiered``): the tiers of this process, with the PS as
  the tier below the host.

Both own a ``PSConnection`` (shards, client, snapshots); ``PSPath`` is what they share.
"""

from __future__ import annotations

from typing import Any

from cosparse.config import Config
from cosparse.store.types import DeliveryHook, TablePlacement, TierPlan
from cosparse.supply.placements import ps_tables, tiered_tables
from cosparse.supply.ps_connection import PSConnection
from cosparse.supply.types import PathContext


class PSPath:
    """A supply path whose rows live on PS shards (started or reached by ``start``)."""

    name = "ps"
    role = "PS"
    below = "trainer_ps"
    stream_errors: tuple[type[BaseException], ...] = ()

    def __init__(self, cfg: Config, ctx: PathContext) -> None:
        self.cfg, self.ctx = cfg, ctx
        self.ps = PSConnection(cfg, ctx)
        self.plans: dict[str, TierPlan] | None = None

    def start(self, plans: dict[str, TierPlan] | None) -> None:
        self.plans = plans
        self.ps.start()

    def placements(self) -> dict[str, TablePlacement]:
        raise NotImplementedError

    @property
    def delivery(self) -> DeliveryHook | None:
        return None

    @property
    def codec(self) -> Any:
        return None

    def describe(self) -> str | None:
        return self.ps.describe(self.role)

    def endpoints(self) -> list[str]:
        return list(self.ps.client.endpoints) if self.ps.client is not None else []

    def on_step(self, step: int) -> None:
        pass

    def health(self) -> str | None:
        return None

    def set_publish_every(self, steps: int) -> None:
        raise ValueError("supply.publish_every: only supply.path 'collaborative' publishes")

    def set_path(self, name: str, step: int) -> None:
        if name != self.name:
            raise ValueError(f"supply.path: '{self.name}' cannot become '{name}' while training "
                             "(only 'collaborative' switches, to 'ps-tiered' and back)")

    def fall_back(self, reason: str, step: int) -> None:
        raise AssertionError(f"supply.path '{self.name}' has nothing to fall back from")

    # --- checkpoints ----------------------------------------------------------------------
    @property
    def rows_on_ps(self) -> bool:
        return self.ps.durable

    def refuse_stale(self) -> None:
        self.ps.refuse_stale()

    def snapshot(self, full: bool) -> dict[str, Any]:
        return self.ps.snapshot(full)

    def prune(self, metas: list[dict[str, Any]]) -> None:
        self.ps.prune(metas)

    def read_ps_table(self, name: str) -> dict[str, Any]:
        assert self.ps.client is not None
        ids, rows = self.ps.client.dump(name)
        return {"ids": ids, "rows": rows}

    def restore(self, meta: dict[str, Any], endpoints: list[str] | None = None) -> bool:
        return self.ps.restore(meta, endpoints)

    # --- metrics and lifetime -------------------------------------------------------------
    def counters(self) -> dict[str, float]:
        return self.ps.counters()

    def gauges(self) -> dict[str, float]:
        return self.ps.gauges()

    @property
    def shard_pids(self) -> list[int]:
        """The embedded shard processes (empty for external shards)."""
        return list(self.ps.shards.pids) if self.ps.shards is not None else []

    def close(self) -> None:
        self.ps.close()


class PSDirectPath(PSPath):
    """Architecture A: the trainer pulls every batch's rows and pushes their gradients."""

    name = "ps-direct"
    role = "supply ps-direct"

    def placements(self) -> dict[str, TablePlacement]:
        assert self.ps.client is not None
        return ps_tables(self.cfg.tables, self.ctx.device, self.ps.client,
                         self.cfg.supply.lookahead, self.plans, self.cfg.train.check_versions)


class RemoteTierPath(PSPath):
    """This process's tiers, with the PS below the host tier (written down to, pulled from)."""

    name = "ps-tiered"
    role = "supply ps-tiered (tiers over the PS)"

    def placements(self) -> dict[str, TablePlacement]:
        assert self.ps.client is not None and self.plans is not None
        return tiered_tables(self.cfg.tables, self.ctx.device, self.plans, self.ps.client)
