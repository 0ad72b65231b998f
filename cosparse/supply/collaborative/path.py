"""CollaborativePath (``supply.path: collaborative``, architecture B): the tiers of this process
over the PS, with the data workers bringing each batch's cold rows over their own PS links.

It owns the PS connection, the shared-memory directory (resident filter and shared batches),
the trainer side of the supply (``CollaborativeSupply``: filter publisher, delivered-row
bookkeeping) and the codec the data workers run. When the workers' rows fail (a worker's PS
link, too many stale rows, a stalled publisher), ``fall_back`` switches to the trainer's own
pulls when ``supply.fallback`` allows it, keeping the tiers. ``set_path`` does the same on
request (the live tuning agent's ``supply.path: ps-tiered``), and can start the workers' rows
again: the tables keep logging their write-backs, so rows delivered after the restart are
checked for staleness as before.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from typing import Any

from cosparse.store.types import DeliveryHook, TablePlacement
from cosparse.supply.collaborative.resident_filter import FilterLayout
from cosparse.supply.collaborative.supply import CollaborativeSupply, DeliveredSource, SupplyFailure
from cosparse.supply.collaborative.types import Delivery, SupplyCounters
from cosparse.supply.collaborative.worker import (
    CollaborativeCodec,
    DeliveryError,
    TableKeys,
    WorkerPS,
)
from cosparse.supply.collaborative.writeback_log import LoggedRemote
from cosparse.supply.placements import tiered_tables
from cosparse.supply.ps_paths import PSPath
from cosparse.supply.shared_memory import shared_dir


class CollaborativePath(PSPath):
    """Architecture B, falling back to the trainer's own pulls when allowed."""

    name = "collaborative"
    role = "supply collaborative (workers deliver cold rows)"
    stream_errors = (DeliveryError,)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.supply: CollaborativeSupply | None = None
        self._codec: CollaborativeCodec | None = None
        self._shm_dir: str | None = None
        self.fallbacks: list[str] = []
        self.counters_b = SupplyCounters()  # across fallbacks and shard restarts
        self.delivering_pids: set[int] = set()  # worker processes whose PS pulls delivered rows
        self._tables: dict[str, TablePlacement] | None = None  # (what a restarted supply serves)
        self._remote: LoggedRemote | None = None
        self.workers_rows = True  # False: set_path('ps-tiered') stopped them

    def placements(self) -> dict[str, TablePlacement]:
        assert self.ps.client is not None and self.plans is not None
        live = not self.fallbacks
        remote = LoggedRemote(self.ps.client) if live else self.ps.client
        tables = tiered_tables(self.cfg.tables, self.ctx.device, self.plans, remote,
                               on_queued=remote.write_pending if live else None)  # type: ignore[union-attr]
        if live:
            self._tables, self._remote = tables, remote  # type: ignore[assignment]
            if self.workers_rows and tables:  # (a rank that holds no table needs no rows)
                self._start_supply(tables, remote)  # type: ignore[arg-type]
        return tables

    def _start_supply(self, tables: dict[str, TablePlacement], remote: LoggedRemote) -> None:
        """Publish the resident filter, and have the data workers bring the rows it does not
        hold over their own PS connections."""
        cfg, sp = self.cfg, self.cfg.supply
        self._stop_supply()
        if self._shm_dir is None:
            self._shm_dir = shared_dir("cosparse-b-")
        assert self.plans is not None and self.ps.client is not None
        capacity = {n: p.device_rows + (p.host_rows or 0) for n, p in self.plans.items()}
        layout = FilterLayout.sized(os.path.join(self._shm_dir, "resident.filter"), capacity,
                                    sp.filter_bits_per_row)
        self.supply = CollaborativeSupply(tables, remote, layout, sp.publish_every,  # type: ignore[arg-type]
                                          sp.publish_timeout_s, sp.max_stale_rate, self.counters_b,
                                          {t.name: t.remote_name for t in cfg.tables})
        keys = [TableKeys(t.name, tuple(t.features), t.hash_size, t.pooling,
                          tuple(t.rows_of) if t.rows_of else None,  # type: ignore[arg-type]
                          t.remote_name)
                for t in cfg.tables]
        r = cfg.store.remote
        ps = WorkerPS(tuple(self.ps.client.endpoints), r.timeout_s, r.heartbeat_s, r.auth_key,
                      self.ctx.links.worker_ps, r.namespace_name)
        self._codec = CollaborativeCodec(self.ctx.train_reader, keys, ps, layout, self._shm_dir)

    def _stop_supply(self) -> None:
        if self.supply is not None:
            self.supply.close()
            self.supply = None
        if self._codec is not None:  # (data.workers 0: the codec ran in this process, its client)
            self._codec.close()
        self._codec = None

    # --- the workers' rows ----------------------------------------------------------------
    @property
    def delivery(self) -> DeliveryHook | None:
        return self if self.supply is not None else None

    @property
    def codec(self) -> CollaborativeCodec | None:
        return self._codec

    def sources(self, delivery: object) -> dict[str, DeliveredSource] | None:
        if self.supply is None or not isinstance(delivery, Delivery):
            return None
        if delivery.error is not None:  # a shared stream's worker failed for this model only
            raise DeliveryError(delivery.error)
        self.delivering_pids.add(delivery.worker_pid)
        return self.supply.sources(delivery)

    def settle(self, sources: Mapping[str, Any]) -> None:
        if self.supply is not None:
            self.supply.settle(sources)

    def on_step(self, step: int) -> None:
        if self.supply is not None:
            self.supply.on_step(step)

    def health(self) -> str | None:
        return self.supply.health() if self.supply is not None else None

    def set_publish_every(self, steps: int) -> None:
        self.cfg.supply.publish_every = steps
        if self.supply is not None:
            self.supply.publish_every = max(1, steps)

    def set_path(self, name: str, step: int) -> None:
        """'ps-tiered': the trainer pulls its own misses from now on (the tiers stay);
        'collaborative': the workers bring the cold rows again."""
        if name == "ps-tiered":
            self._stop_supply()
            self.workers_rows = False
        elif name == "collaborative":
            if self.fallbacks or self._tables is None or self._remote is None:
                raise ValueError("supply.path: the workers' rows fell back "
                                 f"({'; '.join(self.fallbacks) or 'before the tables were built'})"
                                 "; they do not start again")
            if self.supply is None:
                self._start_supply(self._tables, self._remote)
            self.workers_rows = True
        else:
            raise ValueError(f"supply.path: 'collaborative' switches to 'ps-tiered' and back "
                             f"while training, not to '{name}'")
        self.ctx.log(f"supply: {name} from step {step}")

    def fall_back(self, reason: str, step: int) -> None:
        """Go on with the trainer's own pulls (``supply.fallback: ps-direct``), keeping the
        tiers: the batches not yet trained are planned again from the PS. Without it, raise."""
        if self.cfg.supply.fallback is None:
            raise SupplyFailure(f"{reason} (set supply.fallback: ps-direct to go on without the "
                                "workers' rows)")
        self.fallbacks.append(reason)
        self._stop_supply()
        self.ctx.log(f"supply: falling back to ps-direct at step {step}: {reason}")

    # --- metrics and lifetime -------------------------------------------------------------
    def counters(self) -> dict[str, float]:
        c = self.counters_b
        return {**super().counters(), "bytes.worker_ps": c.worker_ps_bytes,
                "wasted_bytes.worker_ps": c.wasted_bytes, "stale_drops": c.stale_drops,
                "delivered_rows": c.delivered_rows, "delivered_rows_used": c.used_rows,
                "filter_publishes": c.publishes}

    def gauges(self) -> dict[str, float]:
        return {**super().gauges(), "fallbacks": len(self.fallbacks)}

    def close(self) -> None:
        self._stop_supply()
        if self._shm_dir is not None:
            shutil.rmtree(self._shm_dir, ignore_errors=True)
            self._shm_dir = None
        super().close()
