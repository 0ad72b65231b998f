"""EmbeddingCollection: the lookup module over each table's ``TablePlacement``, whatever it is.

It does not choose placements: a supply path builds them (``cosparse.supply``) and hands them
in; by default every table is all-resident. ``prepare`` does the host-side ID work of a batch
(dedup, inverse and transposed index): a pure function of the batch, so it can run ahead; its
tables are spread over the calling thread's numba threads (``cosparse.store.prep_threads``).
``stage`` plans a training batch in order through the ``CachePlanner`` (each table's
``plan``, then ``fill`` from its row sources; ``staged`` does both for a stream, reading a
horizon of batches ahead). ``forward`` gathers the planned rows into a compact buffer and pools
them; it refuses a training batch that was not planned. ``apply_gradients`` runs the fused
sparse optimizer on the rows of the last forward, then each table's ``write_back``.

A table with ``pooling: none`` (behaviour sequences) makes every ID its own bag: its rows take
the same path (dedup, tiers, planner, fused optimizer), and ``forward`` gives each of its
features as a ``Jagged`` value (one row per ID, sample-major) instead of a [B, dim] tensor.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from cosparse.batch import SparseBatch
from cosparse.config import TableConfig
from cosparse.nn.pooled_lookup import pooled_lookup
from cosparse.nn.types import Jagged, PreparedBatch
from cosparse.store.admission import Admission
from cosparse.store.all_resident import resident_tables
from cosparse.store.dedup import Deduper, TableIds, table_ids
from cosparse.store.planner import CachePlanner
from cosparse.store.prep_threads import map_tables
from cosparse.store.types import DeliveryHook, TableCounters, TablePlacement


def _id_count(batch: SparseBatch, features: list[str]) -> int:
    """How many IDs ``features`` have in ``batch`` (the size of their table's ID work)."""
    b, offsets = batch.batch_size, batch.offsets
    return sum(int(offsets[(k + 1) * b] - offsets[k * b])
               for k in (batch.keys.index(f) for f in features))


@dataclass
class _Pending:
    table: TablePlacement
    weights: torch.Tensor  # leaf whose .grad receives the row gradients
    state: torch.Tensor
    slots: np.ndarray


class EmbeddingCollection(nn.Module):
    """Pooled (or jagged) embeddings for every feature of ``tables``, over their placements."""

    def __init__(
        self,
        tables: list[TableConfig],
        device: torch.device | str | None = None,
        placements: Mapping[str, TablePlacement] | None = None,
        lookahead: int = 0,
        admit_after: int = 0,
        delivery: DeliveryHook | None = None,
        budget_bytes: int | None = None,
    ) -> None:
        """``placements``: each table's rows (built by a supply path); default all resident, in
        ``budget_bytes`` when given. ``delivery``: rows that come with the batches (B)."""
        super().__init__()
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.configs = {t.name: t for t in tables}
        if placements is None:
            placements = resident_tables(tables, self.device, budget_bytes)
        self.tables: dict[str, TablePlacement] = {t.name: placements[t.name] for t in tables}
        windowed = any(t.pins_rows for t in self.tables.values())
        self.planner = CachePlanner(self.tables, lookahead, windowed=windowed)
        self.delivery = delivery
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

    @property
    def features(self) -> list[str]:
        return list(self.feature_table)

    def dim_of(self, feature: str) -> int:
        return self.configs[self.feature_table[feature]].dim

    # --- host ID work -----------------------------------------------------------------------
    def prepare(self, batch: SparseBatch) -> PreparedBatch:
        """The ID work of each table for ``batch``; a table's that a data worker already did
        (``batch.prepared_ids``, architecture B) is used as it is."""
        t0 = time.perf_counter()
        done = batch.prepared_ids or {}
        todo = [name for name in self.configs if not done.get(name)]

        def ids_of(name: str) -> TableIds:
            dedupers = getattr(self._local, "dedupers", None)  # (this thread's scratch)
            if dedupers is None:
                dedupers = self._local.dedupers = {n: Deduper() for n in self.configs}
            cfg = self.configs[name]
            return table_ids(batch, cfg.features, cfg.hash_size, cfg.pooling, dedupers[name])

        work = map_tables(ids_of, todo, [_id_count(batch, self.configs[n].features)
                                         for n in todo])
        made = dict(zip(todo, work, strict=True))
        out = {name: done.get(name) or made[name] for name in self.configs}
        return PreparedBatch(batch, out, (time.perf_counter() - t0) * 1e3, prep_at=t0)

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
        sources = self.delivery.sources(prepared.batch.delivery) if self.delivery else None
        shrinks = self.planner.shrinks
        plans = self.planner.plan(uniques, blocking, sources)
        prepared.plan_stats = {
            "lookups": sum(p.slots.shape[0] for p in plans.values()),
            "misses": sum(p.miss_ids.shape[0] for p in plans.values()),
            "evictions": sum(p.victims for p in plans.values()),
            "shrinks": self.planner.shrinks - shrinks,
        }
        if sources:
            self.delivery.settle(sources)
        prepared.slots = {name: p.slots for name, p in plans.items()}
        prepared.fill_ms = sum(p.fill_ms for p in plans.values())
        for name, mask in admitted.items():  # IDs not admitted read the default row: slot -1
            slots = np.full(mask.shape[0], -1, dtype=np.int64)
            slots[mask] = prepared.slots[name]
            prepared.slots[name] = slots
        prepared.plan_ms = (time.perf_counter() - t0) * 1e3
        prepared.plan_at = t0
        return prepared

    def prepare_and_stage(self, batch: SparseBatch) -> PreparedBatch:
        """Prepare and plan one training batch inline, on the caller's thread (the previous batch
        must have applied its gradients: there is nothing to wait for)."""
        return self.stage(self.prepare(batch), blocking=False)

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
            raise RuntimeError(
                "EmbeddingCollection: a training batch must be planned before its forward "
                "(ec.prepare_and_stage(batch) inline, or ec.staged(batches) ahead); forward "
                "reads rows, it does not plan them"
            )
        self.stage_ms["prep"] += prepared.prep_ms
        self.stage_ms["plan"] += prepared.plan_ms - prepared.fill_ms
        self.stage_ms["fill"] += prepared.fill_ms
        b = prepared.batch.batch_size
        self._pending = []
        result: dict[str, torch.Tensor | Jagged] = {}
        dev = self.device
        for name, tids in prepared.tables.items():
            table = self.tables[name]
            t0, late0 = time.perf_counter(), table.late_fill_ms
            if self.training:
                slots = prepared.slots[name]  # type: ignore[index]
                w, s = table.gather(slots)
            else:
                w = table.read_rows(tids.unique)
            late = table.late_fill_ms - late0  # rows pulled only now (ps-direct's deferred)
            self.stage_ms["fill"] += late
            self.stage_ms["gather"] += (time.perf_counter() - t0) * 1e3 - late
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
        """Fused sparse-optimizer step on the rows of the last forward (after ``backward``),
        then each updated table writes the update back to where its rows live (a PS push)."""
        t0 = time.perf_counter()
        self.step += 1
        updated = []
        for p in self._pending:
            if p.weights.grad is None:  # (a skipped batch: nothing to update)
                continue
            p.table.apply_gradients(p.weights.detach(), p.state, p.weights.grad, p.slots, self.step)
            p.weights.grad = None
            updated.append(p.table)
        t1 = time.perf_counter()
        for table in updated:
            table.write_back(self.step)
        if self._pending:
            self.planner.mark_done()
        self._pending = []
        self.stage_ms["optim"] += (t1 - t0) * 1e3
        self.stage_ms["writeback"] += (time.perf_counter() - t1) * 1e3

    # --- checkpoint -------------------------------------------------------------------------
    def export_rows(self, skip_ps: bool = False) -> dict[str, dict[str, np.ndarray]]:
        """Every table's rows (dirty device rows are flushed down first); ``skip_ps`` leaves out
        the tables whose rows the PS shards snapshot themselves."""
        out = {}
        for name, t in self.tables.items():
            if skip_ps and t.rows_on_ps:
                continue
            t.flush()
            out[name] = t.export()
        return out

    # --- store metrics ----------------------------------------------------------------------
    def counters(self) -> dict[str, TableCounters]:
        """Store counters of the tables with a bounded device tier (tiered or PS-cached)."""
        return {n: t.counters.copy() for n, t in self.tables.items() if t.counters is not None}

    def hbm_share(self) -> float | None:
        """Device bytes held by sparse rows / the device budget (or the tiers' capacity)."""
        held_cap = [t.device_bytes() for t in self.tables.values()]
        capacity = sum(c for _, c in held_cap)
        if not capacity:
            return None
        return sum(h for h, _ in held_cap) / (self.budget_bytes or capacity)

    def load_rows(
        self, rows: dict[str, dict[str, np.ndarray]], step: int, rows_on_ps: bool = False
    ) -> None:
        """Restore rows from a checkpoint; with ``rows_on_ps`` the PS shards restored their own
        snapshot, and only tables kept elsewhere are loaded."""
        missing = {n for n, t in self.tables.items()
                   if n not in rows and not (rows_on_ps and t.ps_backed)}
        if missing:
            raise ValueError(f"checkpoint has no rows for tables {sorted(missing)}")
        for name, t in self.tables.items():
            if name in rows:
                t.load(rows[name])
            elif rows_on_ps:
                t.drop_local_rows()
        self.step = step
        self.planner.reset(step)
