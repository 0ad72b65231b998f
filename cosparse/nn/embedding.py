"""EmbeddingCollection: the one object the trainer sees per set of tables, whatever the placement.

``prepare`` does the host-side ID work of a batch (dedup, inverse and transposed index): a pure
function of the batch, so it can run ahead. ``stage`` plans a training batch in order: it maps the
unique IDs to device slots, creating rows on first sight or bringing them up from lower tiers,
and pins them (``staged`` does both for a stream, reading a horizon of batches ahead).
``forward`` gathers the unique rows into a compact buffer and pools them. ``apply_gradients``
runs the fused sparse optimizer on the rows of the last forward, writing them back in place.

A table with ``pooling: none`` (behaviour sequences) makes every ID its own bag: its rows take
the same path (dedup, tiers, planner, fused optimizer), and ``forward`` gives each of its
features as a ``Jagged`` value (one row per ID, sample-major) instead of a [B, dim] tensor.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from cosparse.batch import SparseBatch
from cosparse.config import ConfigError, TableConfig
from cosparse.nn.pooled_lookup import pooled_lookup
from cosparse.optim import state_width
from cosparse.ps.client import PSClient
from cosparse.store.admission import Admission
from cosparse.store.dedup import Deduper, TableIds
from cosparse.store.planner import CachePlanner
from cosparse.store.resident import ResidentTable, SlabRows
from cosparse.store.tiered import TieredTable
from cosparse.store.types import RemoteRows, TableCounters
from cosparse.supply.collaborative.supply import CollaborativeSupply
from cosparse.supply.ps_direct import PSCachedTable, PSDirectTable


@dataclass
class Jagged:
    """One unpooled feature: ``values`` [n, dim], the rows of sample ``s`` at
    ``values[offsets[s]:offsets[s + 1]]``; ``lengths`` [B] and ``offsets`` [B + 1] int64."""

    values: torch.Tensor
    lengths: torch.Tensor
    offsets: torch.Tensor

    @property
    def batch_size(self) -> int:
        return int(self.lengths.shape[0])


@dataclass
class PreparedBatch:
    """A batch plus the ID work of each of its tables, and (once staged) their device slots."""

    batch: SparseBatch
    tables: dict[str, TableIds]
    prep_ms: float = 0.0
    slots: dict[str, np.ndarray] | None = None
    plan_ms: float = 0.0


@dataclass
class TierPlan:
    """Where one table's rows live: a bounded device tier over a host tier (and a spill store)."""

    device_rows: int
    host_rows: int | None = None
    spill: bool = False
    device_policy: str = "hotness"
    host_policy: str = "lfu"
    decay: float = 0.99
    ttl_steps: int = 0  # rows untouched this many batches are dropped from every tier (0: off)


@dataclass
class _Pending:
    table: SlabRows
    weights: torch.Tensor  # leaf whose .grad receives the row gradients
    state: torch.Tensor
    slots: np.ndarray


class EmbeddingCollection(nn.Module):
    """Pooled embeddings for every feature of ``tables``; rows all-resident, or in tiers for the
    tables that ``tiers`` names."""

    def __init__(
        self,
        tables: list[TableConfig],
        device: torch.device | str | None = None,
        budget_bytes: int | None = None,
        tiers: dict[str, TierPlan] | None = None,
        lookahead: int = 0,
        admit_after: int = 0,
        ps_client: PSClient | None = None,
        remote_tier: RemoteRows | None = None,
    ) -> None:
        super().__init__()
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.configs = {t.name: t for t in tables}
        share = None
        if budget_bytes is not None and not tiers:
            share = self._budget_shares(tables, budget_bytes)
        tiers = tiers or {}
        self.tables: dict[str, ResidentTable | TieredTable | PSDirectTable | PSCachedTable] = {}
        for t in tables:
            tp = tiers.get(t.name)
            if ps_client is not None:
                if tp is None:
                    self.tables[t.name] = PSDirectTable(t, self.device, ps_client, lookahead)
                else:  # architecture A with a write-through device cache
                    if tp.host_rows is not None or tp.spill:
                        raise ConfigError("store.host: supply.path 'ps-direct' has no host tier")
                    self.tables[t.name] = PSCachedTable(
                        t, self.device, ps_client, tp.device_rows, tp.device_policy, tp.decay
                    )
            elif tp is None:
                self.tables[t.name] = ResidentTable(
                    t, self.device, None if share is None else share[t.name]
                )
            else:
                self.tables[t.name] = TieredTable(
                    t, self.device, tp.device_rows, tp.host_rows, tp.spill, tp.device_policy,
                    tp.host_policy, tp.decay, tp.ttl_steps,
                    remote=remote_tier if tp.spill else None,
                )
        self.planner = CachePlanner(self.tables, lookahead, windowed=bool(tiers) or bool(ps_client))
        self.ps_client = ps_client
        self.supply: CollaborativeSupply | None = None  # architecture B: rows delivered by workers
        self.admission = (
            {t.name: Admission(admit_after) for t in tables} if admit_after > 1 else {}
        )
        self.budget_bytes = budget_bytes
        self.feature_table = {f: t.name for t in tables for f in t.features}
        self._local = threading.local()  # one set of dedup scratch buffers per thread
        self._pending: list[_Pending] = []
        self.step = 0
        self.stage_ms: dict[str, float] = defaultdict(float)
        self.unique_ids: dict[str, int] = {}

    @staticmethod
    def _budget_shares(tables: list[TableConfig], budget: int) -> dict[str, int]:
        """Split the budget by declared row bytes; fail at start-up if declared sizes overflow it."""
        need = {
            t.name: (t.num_embeddings or 0) * 4 * (t.dim + state_width(t.optimizer.kind, t.dim))
            for t in tables
        }
        total = sum(need.values())
        if total > budget:
            raise ConfigError(
                f"store.device.budget_bytes: {budget} bytes cannot hold the declared tables "
                f"({total} bytes: " + ", ".join(f"{k}={v}" for k, v in need.items()) + ")"
            )
        spare = (budget - total) // len(tables)
        return {name: n + spare for name, n in need.items()}

    @property
    def features(self) -> list[str]:
        return list(self.feature_table)

    def dim_of(self, feature: str) -> int:
        return self.configs[self.feature_table[feature]].dim

    # --- host ID work -----------------------------------------------------------------------
    def prepare(self, batch: SparseBatch) -> PreparedBatch:
        t0 = time.perf_counter()
        dedupers = getattr(self._local, "dedupers", None)
        if dedupers is None:
            dedupers = self._local.dedupers = {name: Deduper() for name in self.configs}
        b = batch.batch_size
        values = batch.values.numpy()
        lengths = batch.lengths.numpy()
        offsets = batch.offsets.numpy()
        out: dict[str, TableIds] = {}
        for name, cfg in self.configs.items():
            parts, lens = [], []
            for f in cfg.features:
                k = batch.keys.index(f)
                parts.append(values[offsets[k * b] : offsets[(k + 1) * b]])
                lens.append(lengths[k * b : (k + 1) * b])
            ids = parts[0] if len(parts) == 1 else np.concatenate(parts)
            lens_all = lens[0] if len(lens) == 1 else np.concatenate(lens)
            if cfg.pooling == "none":  # every ID its own bag: rows come back one per ID
                bag_off = np.arange(ids.shape[0] + 1, dtype=np.int64)
            else:
                bag_off = np.zeros(lens_all.shape[0] + 1, dtype=np.int64)
                np.cumsum(lens_all, out=bag_off[1:])
            ids = self.tables[name].map_ids(ids)
            out[name] = dedupers[name].prepare(ids, bag_off, cfg.pooling == "mean")
        return PreparedBatch(batch, out, (time.perf_counter() - t0) * 1e3)

    def stage(self, prepared: PreparedBatch, blocking: bool = True) -> PreparedBatch:
        """Plan a training batch: make its rows resident on the device and pin them.

        Runs in batch order, ahead of training (on the prefetch thread) or inline.
        """
        t0 = time.perf_counter()
        uniques = {name: tids.unique for name, tids in prepared.tables.items()}
        admitted = {name: self.admission[name].observe(u) for name, u in uniques.items()
                    if name in self.admission}
        for name, mask in admitted.items():
            uniques[name] = uniques[name][mask]
        sources = self.supply.sources(prepared.batch.delivery) if self.supply is not None else None
        prepared.slots = self.planner.plan(uniques, blocking, sources)
        if sources:
            self.supply.settle(sources)
        for name, mask in admitted.items():  # IDs not admitted read the default row: slot -1
            slots = np.full(mask.shape[0], -1, dtype=np.int64)
            slots[mask] = prepared.slots[name]
            prepared.slots[name] = slots
        prepared.plan_ms = (time.perf_counter() - t0) * 1e3
        return prepared

    def prepare_and_stage(self, batch: SparseBatch) -> PreparedBatch:
        return self.stage(self.prepare(batch))

    def staged(self, batches: Iterable[SparseBatch], horizon: int = 0) -> Iterator[PreparedBatch]:
        """Prepare and stage ``batches`` in order, reading ``horizon`` batches beyond the one
        being planned so that eviction knows which rows those batches will need."""
        window: deque[PreparedBatch] = deque()

        def leave() -> PreparedBatch:
            p = window.popleft()
            for name, tids in p.tables.items():
                self.tables[name].observe_future(tids.unique, -1)
            return self.stage(p)

        for batch in batches:
            p = self.prepare(batch)
            for name, tids in p.tables.items():
                self.tables[name].observe_future(tids.unique, +1)
            window.append(p)
            if len(window) > horizon:
                yield leave()
        while window:
            yield leave()

    # --- lookup -----------------------------------------------------------------------------
    def forward(self, batch: SparseBatch | PreparedBatch) -> dict[str, torch.Tensor | Jagged]:
        """Per feature: pooled [B, dim] rows, or a ``Jagged`` value for an unpooled table."""
        prepared = batch if isinstance(batch, PreparedBatch) else self.prepare(batch)
        if self.training and prepared.slots is None:
            self.stage(prepared, blocking=False)
        self.stage_ms["prep"] += prepared.prep_ms
        self.stage_ms["plan"] += prepared.plan_ms
        b = prepared.batch.batch_size
        self._pending = []
        result: dict[str, torch.Tensor | Jagged] = {}
        dev = self.device
        for name, tids in prepared.tables.items():
            table = self.tables[name]
            t0 = time.perf_counter()
            if self.training:
                slots = prepared.slots[name]  # type: ignore[index]
                w, s = table.gather(slots)
            else:
                w = table.read_rows(tids.unique)
            self.stage_ms["supply"] += (time.perf_counter() - t0) * 1e3
            self.unique_ids[name] = tids.num_unique
            leaf = w.detach().requires_grad_(self.training)
            pooled = pooled_lookup(
                leaf,
                torch.from_numpy(tids.inverse).to(dev, non_blocking=True),
                torch.from_numpy(tids.offsets).to(dev, non_blocking=True),
                torch.from_numpy(tids.t_offsets).to(dev, non_blocking=True),
                torch.from_numpy(tids.t_bags).to(dev, non_blocking=True),
                torch.from_numpy(tids.t_weights).to(dev, non_blocking=True),
                self.configs[name].pooling == "mean",
            )
            if self.training:
                self._pending.append(_Pending(table, leaf, s, slots))
            if self.configs[name].pooling == "none":
                result.update(self._jagged(prepared.batch, name, pooled))
                continue
            for k, f in enumerate(self.configs[name].features):
                result[f] = pooled[k * b : (k + 1) * b]
        return result

    def _jagged(self, batch: SparseBatch, name: str, rows: torch.Tensor) -> dict[str, Jagged]:
        """Split an unpooled table's rows [n, dim] into one Jagged value per feature."""
        out: dict[str, Jagged] = {}
        b, start = batch.batch_size, 0
        for f in self.configs[name].features:
            k = batch.keys.index(f)
            lengths = batch.lengths[k * b : (k + 1) * b]
            offsets = torch.zeros(b + 1, dtype=torch.int64)
            torch.cumsum(lengths, 0, out=offsets[1:])
            n = int(offsets[-1])
            out[f] = Jagged(rows[start : start + n],
                            lengths.to(self.device, non_blocking=True),
                            offsets.to(self.device, non_blocking=True))
            start += n
        return out

    @torch.no_grad()
    def apply_gradients(self) -> None:
        """Fused sparse-optimizer step on the rows of the last forward (after ``backward``)."""
        t0 = time.perf_counter()
        self.step += 1
        for p in self._pending:
            if p.weights.grad is None:
                continue
            p.table.apply_gradients(p.weights.detach(), p.state, p.weights.grad, p.slots, self.step)
            p.weights.grad = None
        if self._pending:
            self.planner.mark_done()
        self._pending = []
        self.stage_ms["optim"] += (time.perf_counter() - t0) * 1e3

    # --- checkpoint -------------------------------------------------------------------------
    def export_rows(self, skip_ps: bool = False) -> dict[str, dict[str, np.ndarray]]:
        """Every table's rows (dirty device rows are flushed down first); ``skip_ps`` leaves out
        the tables whose rows the PS shards snapshot themselves."""
        out = {}
        for name, t in self.tables.items():
            if skip_ps and isinstance(t, PSDirectTable | PSCachedTable):
                continue
            t.flush()
            out[name] = t.export()
        return out

    # --- store metrics ----------------------------------------------------------------------
    def counters(self) -> dict[str, TableCounters]:
        """Store counters of the tables with a bounded device tier (tiered or PS-cached)."""
        return {n: t.counters.copy() for n, t in self.tables.items() if hasattr(t, "counters")}

    def hbm_share(self) -> float | None:
        """Device bytes held by sparse rows / the device budget (or the tiers' capacity)."""
        tiered = [t for t in self.tables.values() if hasattr(t, "dev")]
        if not tiered:
            return None
        held = sum(t.dev.size * t.row_bytes for t in tiered)
        budget = self.budget_bytes or sum(t.dev.capacity * t.row_bytes for t in tiered)
        return held / budget

    def _on_ps(self, name: str) -> bool:
        """Whether every row of table ``name`` can live on the PS (A, or tiers over the PS)."""
        t = self.tables[name]
        return isinstance(t, PSDirectTable | PSCachedTable) or getattr(t, "remote", None) is not None

    def load_rows(
        self, rows: dict[str, dict[str, np.ndarray]], step: int, rows_on_ps: bool = False
    ) -> None:
        """Restore rows from a checkpoint; with ``rows_on_ps`` the PS shards restored their own
        snapshot, and only tables kept elsewhere are loaded."""
        missing = {n for n in set(self.tables) - set(rows) if not (rows_on_ps and self._on_ps(n))}
        if missing:
            raise ValueError(f"checkpoint has no rows for tables {sorted(missing)}")
        for name, t in self.tables.items():
            if name in rows:
                t.load(rows[name])
            elif rows_on_ps:
                t.release_all()
                if isinstance(t, PSCachedTable):
                    t.dev.remove(t.dev.occupied_slots())
                elif isinstance(t, TieredTable):
                    t.clear()
        self.step = step
        self.planner.reset(step)
