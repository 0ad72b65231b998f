"""ShardedEmbeddingCollection: the embedding lookup of one rank among many, in TorchRec's steps.

1. Input distribution (``input_dist``): the batch's IDs go to their tables' owners; each owner
   rebuilds the global batch of its shards.
2. The local lookup: an ordinary ``EmbeddingCollection`` over this rank's shards, each a full
   ``TablePlacement`` (device tier, host tier, the PS beneath), planned and staged as on one
   process: the planner, the prefetch thread and the fused optimizer are the same.
3. Output distribution: one all-to-all carries every owner's rows for every rank's samples: a
   table-wise table's pooled rows, a column-wise table's column slices (concatenated), a
   row-wise table's partial pools (summed by the receiver: gloo's reduce-scatter, emulated), a
   sequence table's rows (put back in ID order). A replicated table's rows are computed on every
   rank for the global batch; each rank keeps its slice.
4. The backward is the same all-to-all reversed, so each owner receives its rows' gradients for
   the whole global batch and sums them in global sample order, as one process would.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator

import numpy as np
import torch
from torch import nn

from cosparse.batch import SparseBatch
from cosparse.config import TableConfig
from cosparse.nn.embedding import EmbeddingCollection
from cosparse.nn.types import Jagged, PreparedBatch
from cosparse.parallel.collectives import AllToAll, ReplicaSlice
from cosparse.parallel.input_dist import FeatureRoute, Routing, distribute_ids
from cosparse.parallel.shards import rank_tables
from cosparse.parallel.types import ShardingPlan
from cosparse.parallel.world import World


class ShardedEmbeddingCollection(nn.Module):
    """Pooled (or jagged) embeddings of every feature for this rank's samples, from tables
    sharded over the ranks by ``plan``; ``inner`` holds this rank's shards."""

    def __init__(self, tables: list[TableConfig], plan: ShardingPlan, world: World,
                 inner: EmbeddingCollection) -> None:
        super().__init__()
        self.configs = {t.name: t for t in tables}
        self.table_list = tables
        self.plan = plan
        self.world = world
        self.inner = inner
        self.device = inner.device
        self.mine = rank_tables(plan, tables, world.rank)
        self.feature_table = {f: t.name for t in tables for f in t.features}
        # (table, owner rank) -> the width of that owner's shard
        self._width = {(t.name, o): c1 - c0 for t in tables
                       for o, (c0, c1) in zip(plan.tables[t.name].owners,
                                              plan.tables[t.name].columns, strict=True)}
        self._exchanged = [t for t in tables if not plan.tables[t.name].replicated]
        self._replicated = [t for t in tables if plan.tables[t.name].replicated]

    # --- what the model and the trainer read ---------------------------------------------------
    @property
    def features(self) -> list[str]:
        return list(self.feature_table)

    def dim_of(self, feature: str) -> int:
        return self.configs[self.feature_table[feature]].dim

    @property
    def planner(self):  # type: ignore[no-untyped-def]
        return self.inner.planner

    @property
    def stage_ms(self) -> dict[str, float]:
        return self.inner.stage_ms

    @property
    def unique_ids(self) -> dict[str, int]:
        return self.inner.unique_ids

    @property
    def tables(self):  # type: ignore[no-untyped-def]
        return self.inner.tables

    @property
    def admission(self):  # type: ignore[no-untyped-def]
        return self.inner.admission

    def counters(self):  # type: ignore[no-untyped-def]
        return self.inner.counters()

    def hbm_share(self) -> float | None:
        return self.inner.hbm_share()

    # --- input distribution and staging --------------------------------------------------------
    def _route(self, batch: SparseBatch, group: object) -> tuple[SparseBatch, Routing]:
        return distribute_ids(batch, self.plan, self.table_list, self.mine, self.world, group)

    @staticmethod
    def _wrap(batch: SparseBatch, inner: PreparedBatch, routing: Routing) -> PreparedBatch:
        return PreparedBatch(batch, {}, inner.prep_ms + routing.ms, {} if inner.slots is not None
                             else None, inner.plan_ms, inner.fill_ms, shard=(inner, routing))

    def prepare(self, batch: SparseBatch) -> PreparedBatch:
        """Distribute ``batch``'s IDs now, on the trainer's thread (evaluation)."""
        global_batch, routing = self._route(batch, self.world.out_group)
        return self._wrap(batch, self.inner.prepare(global_batch), routing)

    def prepare_and_stage(self, batch: SparseBatch) -> PreparedBatch:
        global_batch, routing = self._route(batch, self.world.out_group)
        return self._wrap(batch, self.inner.prepare_and_stage(global_batch), routing)

    def staged(self, batches: Iterable[SparseBatch], horizon: int = 0) -> Iterator[PreparedBatch]:
        """Distribute and stage ``batches`` in order (on the prefetch thread: its collectives
        use their own group, so they overlap the trainer's)."""
        sent: deque[tuple[SparseBatch, Routing]] = deque()

        def routed() -> Iterator[SparseBatch]:
            for batch in batches:
                global_batch, routing = self._route(batch, self.world.ids_group)
                global_batch.delivery = batch.delivery  # B: this rank's shards' cold rows
                sent.append((batch, routing))
                yield global_batch

        for inner in self.inner.staged(routed(), horizon):
            batch, routing = sent.popleft()
            yield self._wrap(batch, inner, routing)

    # --- lookup ---------------------------------------------------------------------------------
    def forward(self, prepared: SparseBatch | PreparedBatch) -> dict[str, torch.Tensor | Jagged]:
        """Per feature of this rank's samples: pooled [B, dim] rows, or a ``Jagged`` value."""
        if isinstance(prepared, SparseBatch):
            prepared = self.prepare(prepared)
        inner_prep, routing = prepared.shard
        rows = self.inner(inner_prep)
        starts = np.concatenate([[0], np.cumsum(routing.sizes)]).tolist()
        routes = {r.feature: r for r in routing.features}
        out = self._exchange(rows, routing, routes, starts)
        if self._replicated:
            out.update(self._replica_slices(rows, routes, starts))
        return out

    def _rows_for(self, x: torch.Tensor | Jagged, s0: int, s1: int) -> torch.Tensor:
        """The rows of global samples [s0, s1) of one feature's output."""
        if isinstance(x, Jagged):
            return x.values[int(x.offsets[s0]) : int(x.offsets[s1])]
        return x[s0:s1]

    def _exchange(self, rows: dict, routing: Routing, routes: dict[str, FeatureRoute],
                  starts: list[int]) -> dict[str, torch.Tensor | Jagged]:
        """The all-to-all of the exchanged (not replicated) tables' rows, and their combination
        on the receiving rank."""
        if not self._exchanged:
            return {}
        w, rank = self.world.size, self.world.rank
        pieces: list[torch.Tensor] = []
        send_splits = []
        for d in range(w):
            n = 0
            for t in self._exchanged:
                if rank not in self.plan.tables[t.name].owners:
                    continue
                for f in t.features:
                    piece = self._rows_for(rows[f], starts[d], starts[d + 1]).reshape(-1)
                    pieces.append(piece)
                    n += piece.numel()
            send_splits.append(n)
        send = torch.cat(pieces) if pieces else torch.zeros(0, device=self.device)
        if self.training and not send.requires_grad:  # an owner of nothing still joins backward
            send = send.detach().requires_grad_(True)
        recv_splits = []
        for o in range(w):
            n = 0
            for t in self._exchanged:
                s = self.plan.tables[t.name]
                if o in s.owners:
                    i = s.owners.index(o)
                    n += sum(routes[f].rows_from[i] for f in t.features) * self._width[t.name, o]
            recv_splits.append(n)
        t0 = time.perf_counter()
        recv = AllToAll.apply(send, send_splits, recv_splits, self.world.out_group, self.world)
        got: dict[str, list[torch.Tensor]] = {f: [] for t in self._exchanged for f in t.features}
        at = 0
        for o in range(w):
            for t in self._exchanged:
                s = self.plan.tables[t.name]
                if o not in s.owners:
                    continue
                i, width = s.owners.index(o), self._width[t.name, o]
                for f in t.features:
                    n = routes[f].rows_from[i] * width
                    got[f].append(recv[at : at + n].reshape(-1, width))
                    at += n
        out: dict[str, torch.Tensor | Jagged] = {}
        for t in self._exchanged:
            for f in t.features:
                out[f] = self._combine(t, routes[f], got[f], routing.sizes[self.world.rank])
        self.world.comm["output_dist_ms"] += (time.perf_counter() - t0) * 1e3
        return out

    def _combine(self, t: TableConfig, route: FeatureRoute, parts: list[torch.Tensor],
                 b: int) -> torch.Tensor | Jagged:
        """One feature's output from its owners' parts."""
        s = self.plan.tables[t.name]
        if s.kind == "column_wise":
            x = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
        elif s.route == "hash" and route.pooled:  # partial pools: the emulated reduce-scatter
            x = parts[0]
            for p in parts[1:]:
                x = x + p
            if route.lengths is not None:
                lens = torch.from_numpy(np.maximum(route.lengths, 1)).to(x.device, x.dtype)
                x = x / lens[:, None]
        elif s.route == "hash":  # sequence rows, back in this rank's ID order
            x = torch.cat(parts)[torch.from_numpy(route.order).to(parts[0].device)]
        else:
            x = parts[0]
        return x if route.pooled else self._jagged(x, route, b)

    def _jagged(self, values: torch.Tensor, route: FeatureRoute, b: int) -> Jagged:
        lengths = torch.from_numpy(route.lengths)
        offsets = torch.zeros(b + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=offsets[1:])
        return Jagged(values, lengths.to(self.device), offsets.to(self.device))

    def _replica_slices(self, rows: dict, routes: dict[str, FeatureRoute], starts: list[int]
                        ) -> dict[str, torch.Tensor | Jagged]:
        """This rank's slice of every replicated table's global output."""
        w = self.world.size
        feats = [(t, f) for t in self._replicated for f in t.features]
        full = torch.cat([self._rows_for(rows[f], starts[d], starts[d + 1]).reshape(-1)
                          for d in range(w) for _, f in feats])
        splits = [sum(self._rows_for(rows[f], starts[d], starts[d + 1]).numel() for _, f in feats)
                  for d in range(w)]
        mine = ReplicaSlice.apply(full, splits, self.world.dp_group, self.world)
        out: dict[str, torch.Tensor | Jagged] = {}
        at, r = 0, self.world.rank
        for _, f in feats:
            x = self._rows_for(rows[f], starts[r], starts[r + 1])
            part = mine[at : at + x.numel()].reshape(x.shape)
            at += x.numel()
            out[f] = part if routes[f].pooled else self._jagged(part, routes[f],
                                                                 starts[r + 1] - starts[r])
        return out

    # --- update ---------------------------------------------------------------------------------
    def apply_gradients(self) -> None:
        """The fused sparse optimizer on this rank's shards (their rows' gradients came back
        through the all-to-all's backward)."""
        self.inner.apply_gradients()
