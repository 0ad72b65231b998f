"""What a trainer sets up before its first step: the probe batches, the tiers sized from them
(dense first, sparse the rest), the embedding collection over the supply path's placements,
and ``close``, which stops what the set-up started.

A role of ``cosparse.train.trainer.Trainer``.
"""

from __future__ import annotations

import itertools

from cosparse.data.reader import NOT_YET
from cosparse.nn.embedding import EmbeddingCollection
from cosparse.parallel.sharded import ShardedEmbeddingCollection
from cosparse.train.sizing import SizingReport, describe, measure_dense_bytes, size_tiers


class SetupRole:
    """Tier sizing and the embedding collection for ``Trainer``."""

    def _probe(self) -> list:
        """The first ``store.probe_batches`` batches of the training data."""
        tasks = self.train_reader.tasks()
        ready = itertools.takewhile(lambda t: t is not NOT_YET, tasks)  # (a stream: what is there)
        probe = [self.train_reader.build(t)
                 for t in itertools.islice(ready, self.cfg.store.probe_batches)]
        if hasattr(tasks, "close"):
            tasks.close()
        return probe

    def _size_tiers(self) -> SizingReport:
        """Dense first, sparse the rest: size the tiers from a dry run and the first batches."""
        cfg = self.shard_cfg
        probe = self._probe()
        dense = 0
        if cfg.store.device.budget_bytes is not None:
            dense = measure_dense_bytes(self.model, probe[0], cfg.model.dense_optimizer.kind,
                                        cfg.objective)
        self.sizing = size_tiers(cfg, probe, dense)
        self.log(describe(self.sizing))
        return self.sizing

    def _install_collection(self) -> None:
        """The model's embedding collection over the supply path's table placements."""
        cfg = self.shard_cfg
        ec = EmbeddingCollection(
            cfg.tables, self.device, self.path.placements(), lookahead=cfg.supply.lookahead,
            admit_after=cfg.store.admit_after, delivery=self.path.delivery,
            budget_bytes=cfg.store.device.budget_bytes,  # type: ignore[arg-type]
        )
        if self.ranks and self.ranks.plan:  # the lookup of the global tables around its shards
            ec = ShardedEmbeddingCollection(self.cfg.tables, self.ranks.plan, self.ranks.world,
                                            ec)
        self.model.ec = self.ec = ec
        if hasattr(self, "recorder"):  # (bound methods, not closures over the trainer: no cycle)
            self.recorder.table_counters = ec.counters

    def close(self) -> None:
        """Flush the metrics and the step records, write the trace (``train.trace``), and stop
        what the supply path started (safe to call twice)."""
        if self._kept is not None:
            self._kept[0].close()
            self._kept = None
        self.sink.close()
        self.health.close()
        trace = self.recorder.close()
        if trace is not None:
            self.log(f"trace: {trace} (open it in ui.perfetto.dev or chrome://tracing)")
        self.path.close()
        if self.ranks:
            self.ranks.world.close()
