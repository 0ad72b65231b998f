"""LocalPath: every row in this process, all resident or in tiers (device, host, an in-process
spill store). No PS, no workers' rows: the simplest supply path, and the reference one."""

from __future__ import annotations

from typing import Any

from cosparse.config import Config
from cosparse.store.all_resident import resident_tables
from cosparse.store.types import DeliveryHook, TablePlacement, TierPlan
from cosparse.supply.placements import tiered_tables
from cosparse.supply.types import PathContext


class LocalPath:
    """``supply.path: resident``: all-resident tables, or tiers for those with a tier plan."""

    name = "resident"
    below = "backing"
    rows_on_ps = False
    stream_errors: tuple[type[BaseException], ...] = ()
    delivery: DeliveryHook | None = None
    codec: Any = None

    def __init__(self, cfg: Config, ctx: PathContext) -> None:
        self.cfg, self.ctx = cfg, ctx
        self.plans: dict[str, TierPlan] | None = None

    def start(self, plans: dict[str, TierPlan] | None) -> None:
        self.plans = plans

    def placements(self) -> dict[str, TablePlacement]:
        if self.plans is not None:  # a rank holding no table has an empty plan: no tables
            return tiered_tables(self.cfg.tables, self.ctx.device, self.plans)
        return dict(resident_tables(self.cfg.tables, self.ctx.device,
                                    self.cfg.store.device.budget_bytes))

    def describe(self) -> str | None:
        return None

    def endpoints(self) -> list[str]:
        return []

    def on_step(self, step: int) -> None:
        pass

    def health(self) -> str | None:
        return None

    def set_publish_every(self, steps: int) -> None:
        raise ValueError("supply.publish_every: only supply.path 'collaborative' publishes")

    def set_path(self, name: str, step: int) -> None:
        if name != self.name:
            raise ValueError(f"supply.path: '{self.name}' cannot become '{name}' while training")

    def fall_back(self, reason: str, step: int) -> None:
        raise AssertionError("the resident path has nothing to fall back from")

    def refuse_stale(self) -> None:
        pass

    def snapshot(self, full: bool) -> dict[str, Any]:
        return {}

    def prune(self, metas: list[dict[str, Any]]) -> None:
        pass

    def read_ps_table(self, name: str) -> dict[str, Any]:
        raise AssertionError("the resident path reaches no PS")

    def restore(self, meta: dict[str, Any], endpoints: list[str] | None = None) -> bool:
        return False

    def counters(self) -> dict[str, float]:
        return {}

    def gauges(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass
