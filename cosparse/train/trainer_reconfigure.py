"""Live knobs applied between two batches of a run (``cosparse.train.live``): lookahead, tier
capacities, publish interval, the supply path; each change written to the metrics.

A role of ``cosparse.train.trainer.Trainer``.
"""

from __future__ import annotations

from cosparse.store.tiered import TieredTable
from cosparse.train.live import Reconfigure, set_live


class ReconfigureRole:
    """Live reconfiguration for ``Trainer``."""

    def _reconfigure(self, r: Reconfigure) -> None:
        """Apply live knobs between two batches (the stream and planner are stopped)."""
        for cfg in {id(self.cfg): self.cfg, id(self.shard_cfg): self.shard_cfg}.values():
            set_live(cfg, r.changes)
        self.ec.planner.set_lookahead(self.cfg.supply.lookahead)
        if "store.device.rows" in r.changes or "store.host.rows" in r.changes:
            self._resize_tiers(r.changes.get("store.device.rows"), r.changes.get("store.host.rows"))
        if "supply.publish_every" in r.changes:
            self.path.set_publish_every(self.cfg.supply.publish_every)
        if "supply.path" in r.changes:  # (B's workers' rows on or off: the tiers stay)
            self.path.set_path(self.cfg.supply.path, self.state.step)
            self.ec.delivery = self.path.delivery
        self._pending = None
        self.sink.write({"kind": "reconfigure", "step": self.state.step, "changes": r.changes,
                         "reason": r.reason, "by": r.by})
        said = ", ".join(f"{k} = {v}" for k, v in r.changes.items())
        self.log(f"step {self.state.step}: {r.by or 'a callback'} set {said}"
                 + (f" ({r.reason})" if r.reason else ""))

    def _resize_tiers(self, device_rows: int | None, host_rows: int | None) -> None:
        """Every tiered table's capacities, and the sizing report that describes them."""
        plans = self.sizing.plans if self.sizing is not None else {}
        for name, table in self.ec.tables.items():
            if isinstance(table, TieredTable):
                table.resize(device_rows, host_rows, self.state.step)
                plan = plans.get(name)
                if plan is not None:
                    plan.device_rows = table.dev.limit
                    plan.host_rows = table.host.limit if table.host.bounded else None
