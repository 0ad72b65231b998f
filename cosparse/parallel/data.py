"""The data split by global sample order: rank r trains samples [start_r, start_r + size_r) of
every global batch, so the global batch (and the order of its samples) is the same at every
world size.

The shares are equal in samples, or (``balance: ids``, for long behaviour sequences) equal in
IDs: a rank whose samples hold 10,000-event histories gets fewer of them, so it does not stall
the others. Either way the split is contiguous, so results do not depend on it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import numpy as np
import torch

from cosparse.batch import SparseBatch


def split_sizes(batch_size: int, world: int) -> list[int]:
    """Each rank's share of a global batch: equal, the first ranks one larger."""
    q, r = divmod(batch_size, world)
    return [q + (i < r) for i in range(world)]


def balanced_sizes(batch: SparseBatch, world: int) -> list[int]:
    """Each rank's share of a global batch, contiguous, with about as many IDs each (every
    rank keeps a sample at least, when there are enough)."""
    b = batch.batch_size
    if not batch.keys or b < world:
        return split_sizes(b, world)
    per_sample = batch.lengths.numpy().reshape(len(batch.keys), b).sum(axis=0)
    ends = np.cumsum(per_sample)
    cuts = np.searchsorted(ends, ends[-1] * np.arange(1, world) / world, side="left") + 1
    cuts = np.clip(cuts, np.arange(1, world), b - world + np.arange(1, world))
    cuts = np.maximum.accumulate(cuts)
    edges = np.concatenate([[0], cuts, [b]])
    return np.diff(edges).astype(int).tolist()


def local_part(batch: SparseBatch, rank: int, world: int, balance: str = "samples"
               ) -> SparseBatch:
    """This rank's samples of the global ``batch``, every feature's bags and the dense rows."""
    b = batch.batch_size
    sizes = balanced_sizes(batch, world) if balance == "ids" else split_sizes(b, world)
    s0 = sum(sizes[:rank])
    s1 = s0 + sizes[rank]
    lengths, offsets = batch.lengths.numpy(), batch.offsets.numpy()
    nk = len(batch.keys)
    firsts = np.arange(nk) * b
    lens = np.concatenate([lengths[f + s0 : f + s1] for f in firsts]) if nk else lengths[:0]
    values = batch.values.numpy()
    vals = np.concatenate([values[offsets[f + s0] : offsets[f + s1]] for f in firsts]) if nk \
        else values[:0]
    return dataclasses.replace(
        batch, values=torch.from_numpy(np.ascontiguousarray(vals)),
        lengths=torch.from_numpy(np.ascontiguousarray(lens)),
        dense=batch.dense[s0:s1], labels=batch.labels[s0:s1], _offsets=None,
        task_labels=None if batch.task_labels is None else {
            k: v[s0:s1] for k, v in batch.task_labels.items()},
        weights=None if batch.weights is None else batch.weights[s0:s1],
        prepared_ids=None,  # (the global batch's: this rank's shards are prepared anew)
        # the rows this rank's workers delivered (architecture B) stay with the batch: they are
        # its shards' rows of the global batch
        # the global batch's counts are the leader's to report, once
        bad_records=batch.bad_records if rank == 0 else 0,
        features_computed=batch.features_computed if rank == 0 else 0,
    )


def local_parts(batches: Iterable[SparseBatch], rank: int, world: int,
                balance: str = "samples") -> Iterator[SparseBatch]:
    for batch in batches:
        yield local_part(batch, rank, world, balance)
