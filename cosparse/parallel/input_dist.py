"""Input distribution: each rank's batch IDs go to the ranks that hold their rows, in two
all-to-alls (first the splits, then the IDs and bag lengths), and each owner rebuilds the global
batch of its shards, sample after sample in global order (rank 0's samples, then rank 1's, ...),
feature-major as a ``SparseBatch``: the batch one process would have seen, minus, for a
row-wise shard, the IDs other ranks own.

``Routing`` is what a rank keeps to read the rows that come back: how many each owner sends for
each feature, and where a row-wise sequence feature's rows go back in order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cosparse.batch import SparseBatch
from cosparse.config import TableConfig
from cosparse.parallel.collectives import all_to_all
from cosparse.parallel.shards import row_owner
from cosparse.parallel.types import ShardingPlan
from cosparse.parallel.world import World
from cosparse.store.dedup import map_ids, table_parts


@dataclass
class FeatureRoute:
    """How one feature of this rank's batch comes back: ``rows_from[i]`` rows from the table's
    owner ``i`` (pooled: one per sample; sequence: one per ID sent there)."""

    table: str
    feature: str
    pooled: bool
    rows_from: list[int]
    order: np.ndarray | None = None  # row-wise sequence: each ID's position in owner order
    # this rank's bag lengths: a sequence feature's, and a row-wise mean's (the divisor)
    lengths: np.ndarray | None = None


@dataclass
class Routing:
    """One batch's input distribution, as the rank that sent it keeps it."""

    sizes: list[int]  # every rank's local batch size, in rank order
    features: list[FeatureRoute]
    ms: float = 0.0

    @property
    def global_size(self) -> int:
        return sum(self.sizes)


def _split_by_owner(keys: np.ndarray, lens: np.ndarray, owners: int
                    ) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray, np.ndarray]:
    """A row-wise feature's keys per owner (sample order kept), their per-sample counts, the
    number each owner gets, and each key's position in the owner-sorted order."""
    shard = row_owner(keys, owners)
    order = np.argsort(shard, kind="stable")
    counts = np.bincount(shard, minlength=owners)
    bags = np.repeat(np.arange(lens.shape[0], dtype=np.int64), lens)[order]
    ends = np.cumsum(counts)
    starts = ends - counts
    ids_to = [keys[order[a:b]] for a, b in zip(starts, ends, strict=True)]
    lens_to = [np.bincount(bags[a:b], minlength=lens.shape[0]).astype(np.int64)
               for a, b in zip(starts, ends, strict=True)]
    position = np.empty_like(order)
    position[order] = np.arange(order.shape[0])
    return ids_to, lens_to, counts, position


def route_batch(batch: SparseBatch, plan: ShardingPlan, tables: list[TableConfig],
                world: World) -> tuple[list[np.ndarray], list[int], list[FeatureRoute]]:
    """Per destination rank, the int64 payload (bag lengths, then IDs) and its ID count; and
    this batch's routes."""
    n = world.size
    lens_to: list[list[np.ndarray]] = [[] for _ in range(n)]
    ids_to: list[list[np.ndarray]] = [[] for _ in range(n)]
    routes: list[FeatureRoute] = []
    b = batch.batch_size
    for t in tables:
        s = plan.tables[t.name]
        pooled = t.pooling != "none"
        for f in t.features:
            ids, lens = table_parts(batch, [f])
            keys = map_ids(ids, t.hash_size)
            if s.route == "all":
                for d in s.owners:
                    lens_to[d].append(lens)
                    ids_to[d].append(keys)
                rows = b if pooled else keys.shape[0]
                routes.append(FeatureRoute(t.name, f, pooled, [rows] * len(s.owners),
                                           lengths=None if pooled else lens.copy()))
                continue
            per_ids, per_lens, counts, position = _split_by_owner(keys, lens, len(s.owners))
            for i, d in enumerate(s.owners):
                lens_to[d].append(per_lens[i])
                ids_to[d].append(per_ids[i])
            routes.append(FeatureRoute(
                t.name, f, pooled, [b] * len(s.owners) if pooled else counts.tolist(),
                order=None if pooled else position,
                lengths=lens.copy() if t.pooling in ("mean", "none") else None))
    payloads = [np.concatenate([*lens_to[d], *ids_to[d]]) if lens_to[d]
                else np.zeros(0, dtype=np.int64) for d in range(n)]
    n_ids = [int(sum(x.shape[0] for x in ids_to[d])) for d in range(n)]
    return payloads, n_ids, routes


def distribute_ids(batch: SparseBatch, plan: ShardingPlan, tables: list[TableConfig],
                   mine: list[TableConfig], world: World, group: Any
                   ) -> tuple[SparseBatch, Routing]:
    """The two-phase all-to-all of ``batch``'s IDs: returns the global batch of this rank's
    shards (``mine``) and the batch's ``Routing``."""
    t0 = time.perf_counter()
    payloads, n_ids, routes = route_batch(batch, plan, tables, world)
    n = world.size
    counts = torch.tensor([[batch.batch_size, k] for k in n_ids], dtype=torch.int64).reshape(-1)
    got = all_to_all(counts, [2] * n, [2] * n, group, world).reshape(n, 2).tolist()
    sizes = [int(g[0]) for g in got]
    feats = [f for t in mine for f in t.features]
    nf = len(feats)
    send = torch.from_numpy(np.concatenate(payloads)) if payloads else torch.zeros(0)
    recv = all_to_all(send, [p.shape[0] for p in payloads],
                      [sizes[r] * nf + int(got[r][1]) for r in range(n)], group, world).numpy()
    lens_parts, id_parts = [], [[] for _ in range(nf)]
    at = 0
    for r in range(n):
        lens = recv[at : at + sizes[r] * nf].reshape(nf, sizes[r])
        at += sizes[r] * nf
        lens_parts.append(lens)
        for k, c in enumerate(lens.sum(axis=1).tolist()):
            id_parts[k].append(recv[at : at + c])
            at += c
    bg = sum(sizes)
    lengths = np.concatenate(lens_parts, axis=1).reshape(-1) if nf else np.zeros(0, np.int64)
    values = np.concatenate([p for parts in id_parts for p in parts]) if nf else \
        np.zeros(0, np.int64)
    global_batch = SparseBatch(
        feats, torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64)),
        torch.from_numpy(np.ascontiguousarray(lengths, dtype=np.int64)),
        torch.zeros(bg, 0), torch.zeros(bg), index=batch.index)
    return global_batch, Routing(sizes, routes, (time.perf_counter() - t0) * 1e3)
