"""Trainer: the training loop (data stream, prefetch, forward/backward, sparse and dense optimizer
steps), evaluation, progress, metrics and checkpoints.

How rows reach the trainer is the supply path's business (``cosparse.supply``: resident or
tiered rows, ps-direct, collaborative); the trainer builds the path the config names, asks it
for each table's placement, and calls it at each step, checkpoint and log point.
One training step reads top to bottom in ``_train_step``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from cosparse import omp_wait, waits
from cosparse.config import Config, ConfigError
from cosparse.config.train import run_limits
from cosparse.data import BatchStream
from cosparse.data.pool import WorkerExited
from cosparse.data.reader import NOT_YET
from cosparse.link import Links
from cosparse.nn.embedding import EmbeddingCollection
from cosparse.nn.models import build_model
from cosparse.nn.types import PreparedBatch
from cosparse.parallel.data import local_parts
from cosparse.parallel.dense import dense_parallel, sum_fsdp2_gradients
from cosparse.parallel.engine import RankSetup, reach_shared_ps, share_ps, start_rank
from cosparse.parallel.loss import global_bce
from cosparse.parallel.sharded import ShardedEmbeddingCollection
from cosparse.parallel.world import launched_by_torchrun
from cosparse.stall import Progress
from cosparse.store.tiered import TieredTable
from cosparse.supply.paths import make_supply_path
from cosparse.supply.types import PathContext, SnapshotMismatch
from cosparse.train.checkpoint import (
    BEST,
    BEST_STATE,
    CheckpointError,
    TrainState,
    checkpoint_os_advice,
    checkpoint_os_error,
    load_checkpoint,
    ps_metas,
    read_meta,
    resolve_checkpoint,
    save_checkpoint,
)
from cosparse.train.cpu_budget import apply_cpu, cpu_shares
from cosparse.train.dense import make_dense_optimizer, pick_device, warm_up_vector_math
from cosparse.train.early_stop import EarlyStopper
from cosparse.train.evaluate import joined_batches, log_loss, roc_auc
from cosparse.train.health import HealthMonitor
from cosparse.train.inputs import (
    WORKER_PRELOAD,
    ModelInputs,
    check_table_features,
    model_inputs,
)
from cosparse.train.leftovers import sweep_dead_runs
from cosparse.train.live import Reconfigure, set_live
from cosparse.train.metrics import IntervalCounters, IntervalStats, MetricsSink, latency_figures
from cosparse.train.nonfinite import NonFiniteLoss
from cosparse.train.prefetch import Prefetcher
from cosparse.train.progressive import ProgressiveWindow
from cosparse.train.sharded_checkpoint import (
    load_sharded_dense,
    load_sharded_rows,
    my_shards,
    save_sharded,
)
from cosparse.train.sizing import SizingReport, describe, measure_dense_bytes, size_tiers
from cosparse.train.step_records import StepRecorder, steps_path
from cosparse.train.summary import RunSummary
from cosparse.tune.hotness import table_hotness


class Trainer:
    """Trains ``cfg.model`` on ``cfg.data``; ``run`` returns the final metrics."""

    def __init__(self, cfg: Config, log: Callable[[str], None] | None = None,
                 inputs: ModelInputs | None = None,
                 stream_factory: Callable[[int], Any] | None = None,
                 on_interval: Callable[[dict[str, Any]], Reconfigure | None] | None = None
                 ) -> None:
        """``inputs``: the readers (default: from ``cfg.data`` and ``cfg.features``);
        ``stream_factory(start_batch)``: the training batches of an epoch, instead of a data
        stream of this trainer's own (a multi-model run hands each model its view);
        ``on_interval(record)``: called with every interval's metrics, as they are written
        (what a tuning agent watches a run through); it may answer with live knobs to change,
        which apply before the next batch (``cosparse.train.live``)."""
        self.on_interval = on_interval
        self._pending: Reconfigure | None = None
        self.log = log or (lambda msg: tqdm.write(msg))
        swept = sweep_dead_runs(cfg)  # what runs that are gone left: never a live run's
        if swept:
            self.log(f"swept {len(swept)} leftovers of runs that are gone: "
                     f"{', '.join(str(p) for p in swept[:5])}{' ...' if len(swept) > 5 else ''}")
        self.cpu = cpu_shares(cfg)
        apply_cpu(self.cpu)
        warm_up_vector_math()
        torch.manual_seed(cfg.train.seed)
        many = launched_by_torchrun() and int(os.environ["WORLD_SIZE"]) > 1
        if cfg.data.stream is not None and (many or stream_factory is not None):
            raise ConfigError("data.stream: a stream trains one model on one process "
                              "(no torchrun world, no models list)")
        self.device = pick_device(cfg.train.device)
        self.inputs = inputs or model_inputs(cfg)
        self.cfg = cfg = self.inputs.cfg
        self.stream_factory = stream_factory
        self.bar_desc: str | None = None  # the progress bar's label and row (several models)
        self.bar_position: int | None = None
        self.train_reader = self.inputs.train
        self.eval_reader = self.inputs.eval
        for note in self.inputs.notes:
            self.log(note)
        # data.stream: the scores of each batch before it trains (progressive validation)
        st = cfg.data.stream
        self.progressive = ProgressiveWindow(st.eval_window_rows) if st is not None else None
        if st is not None:
            self.train_reader.log = self.log
        check_table_features(cfg, self.train_reader)
        self.model = build_model(cfg, self.train_reader.num_dense, self.device)
        self.links = Links.from_config(cfg.network)
        # many ranks (torchrun): this rank's shards are the tables its supply path places
        self.ranks: RankSetup | None = None
        if launched_by_torchrun() and int(os.environ["WORLD_SIZE"]) > 1:
            self.ranks = start_rank(cfg, self.device, self._probe, self.log, table_hotness(cfg))
            if not self.ranks.world.leader:
                self.log = lambda msg: None
        self.shard_cfg = self.ranks.shard_cfg if self.ranks else cfg
        # many ranks over a PS: rank 0 starts the shards, the other ranks reach them
        shared_ps = self.ranks is not None and cfg.supply.path != "resident"
        if shared_ps and not self.ranks.world.leader:  # type: ignore[union-attr]
            self.shard_cfg = reach_shared_ps(self.shard_cfg, share_ps(self.ranks, None))
        self.path = make_supply_path(self.shard_cfg, PathContext(
            self.device, self.links, self.train_reader, self.log))
        self.sizing: SizingReport | None = None
        try:  # what the path started stops again if the rest of the set-up fails
            try:
                self.path.start(self._size_tiers().plans if cfg.store.tiered else None)
            except BaseException as e:
                if shared_ps and self.ranks.world.leader:  # type: ignore[union-attr]
                    share_ps(self.ranks, None, f"{type(e).__name__}: {e}")  # type: ignore[arg-type]
                raise
            if shared_ps and self.ranks.world.leader:  # type: ignore[union-attr]
                share_ps(self.ranks, self.path.endpoints())  # type: ignore[arg-type]
            self._install_collection()
            # the module that trains: the model, or its data-parallel wrapper on many ranks
            self.train_model = dense_parallel(self.model, cfg.parallel.dense, self.ranks.world,
                                              self.device) if self.ranks else self.model
            self.dense_opt = make_dense_optimizer(cfg, list(self.train_model.parameters()))
            if self.ranks:
                sum_fsdp2_gradients(self.dense_opt, cfg.parallel.dense, self.ranks.world)
            leader = self.ranks is None or self.ranks.world.leader  # one rank writes metrics
            self.sink = MetricsSink(cfg.train.metrics_json if leader else None,
                                    cfg.train.tensorboard_dir if leader else None)
            self.recorder = StepRecorder(
                steps_path(cfg.train.metrics_json) if leader and cfg.train.metrics_json else None,
                cfg.train.trace if leader else None,
                {"supply_path": cfg.supply.path, "lookahead": cfg.supply.lookahead,
                 "tiered": cfg.store.tiered, "log_every": cfg.train.log_every},
                self.path.counters, self.ec.counters)
            self.health = HealthMonitor(cfg.train.health, cfg.supply.lookahead, self.log)
        except BaseException:
            self.path.close()
            if self.ranks:
                self.ranks.world.close()
            raise
        said = self.path.describe()
        if said:
            self.log(said)
        self.state = TrainState(step=0, epoch=0, batch_in_epoch=0)
        self.resumed = False  # a fresh run on an earlier run's PS snapshots is refused
        self.losses: list[float] = []
        self.bad_records = 0
        self.skipped_batches = 0  # batches whose loss was not finite (train.on_nonfinite)
        self.wire_bytes = 0  # bytes of every batch message on the worker->trainer link
        self.features_computed = 0  # feature computations behind the batches trained
        self.data_worker_pids: set[int] = set()  # every data-worker process started
        self.stream: Any = None  # the live data stream (its worker pids: ``stream.pids``)
        # the stream a run that ended at its step count left open for the next ``run`` to go on
        # with, and where it stands (epoch, batch): its data workers need no restart
        self._kept: tuple[Any, int, int] | None = None
        self.progress = Progress("the trainer")  # what the planner and prefetch waits watch
        self._saves = 0  # checkpoints this process committed
        self._saved: tuple[int, Path] | None = None  # the last checkpoint in checkpoint.dir
        # the PS snapshots of the newest saves ({step, snapshots}; store.remote.snapshot_keep)
        self._ps_history: list[dict[str, Any]] = []
        self._stages: dict[str, float] = {}
        self._marks: dict[str, float] = {}  # when each of the trainer's own stages started
        self.interval_counters = IntervalCounters(self.ec, self.path, self.wire_bytes)
        self._trained_here = 0  # steps this process trained (the summary's timing warm-up)
        self._comm_seen: dict[str, tuple[float, float]] = {}  # rank-rank counters at a baseline
        self._eval_at: tuple[int, dict[str, Any]] | None = None  # the last evaluation's step
        es = cfg.train.early_stop
        self.early = EarlyStopper(es) if es is not None else None
        self._observed_step: int | None = None  # the step early stopping last judged
        self._stop_early = False
        self._stream_ended = False  # data.stream: nothing new for data.stream.idle_timeout_s
        self._saved_at = time.monotonic()  # (train.checkpoint.every_s)

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
            dense = measure_dense_bytes(self.model, probe[0], cfg.model.dense_optimizer.kind)
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

    # --- checkpoints --------------------------------------------------------------------------
    def save(self, root: str | None = None, keep: int | None = None) -> Path:
        """Checkpoint atomically (into ``root``, default ``train.checkpoint.dir``, keeping the
        newest ``keep``, default ``train.checkpoint.keep``). When the PS snapshots its rows, the
        shards snapshot them and the trainer's checkpoint records those snapshots: both parts
        commit with one step number or neither does. Otherwise the PS rows are read into the
        trainer's checkpoint. Returns the checkpoint's directory."""
        ck, step = self.cfg.train.checkpoint, self.state.step
        into = root or ck.dir
        keep = ck.keep if keep is None else keep
        dense = {
            "model": self.model.state_dict(),
            "optimizer": self.dense_opt.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "bad_records": self.bad_records,
        }

        snapshot_keep = self.cfg.store.remote.snapshot_keep or ck.keep
        history: list[dict[str, Any]] = []

        def snapshot_ps() -> dict[str, Any]:
            self.progress.beat(f"checkpoint at step {step}: PS snapshots")
            # a full snapshot every `snapshot_keep` saves, so pruning can drop the chains before it
            full = self._saves % max(1, snapshot_keep) == 0
            ps = {**self.path.snapshot(full), "step": step}
            if into == ck.dir:  # the newest saves' snapshots, kept for `cosparse export --since`
                history[:] = [*(h for h in self._ps_history if h["step"] < step),
                              {"step": step, "snapshots": ps["snapshots"]}][-snapshot_keep:]
                ps["history"] = history
            return {"ps": ps}

        self.progress.beat(f"checkpoint at step {step}: exporting rows")
        on_ps = self.path.rows_on_ps
        try:
            if self.ranks:  # every rank its shards, through DCP, committed by rank 0
                path = save_sharded(into, self.state, self.train_model,  # type: ignore[arg-type]
                                    self.dense_opt, self.ec, self.ranks.world,
                                    dataclasses.asdict(self.cfg), keep,
                                    before_commit=snapshot_ps if on_ps else None)
            else:
                path = save_checkpoint(
                    into, self.state, dense,  # type: ignore[arg-type]
                    self.ec.export_rows(skip_ps=on_ps), dataclasses.asdict(self.cfg),
                    keep=keep, before_commit=snapshot_ps if on_ps else None,
                )
        except OSError as e:  # disk full, quota, I/O error: nothing of this save is committed
            raise CheckpointError(
                f"writing the checkpoint of step {step} under {into} failed: "
                f"{checkpoint_os_error(e)}; nothing of it was committed and the previous "
                f"checkpoint is intact ({checkpoint_os_advice(e)}, then rerun with --resume)"
            ) from e
        self._saves += 1
        self._saved_at = time.monotonic()
        if into == ck.dir:
            self._saved = (step, Path(path))
            if history:
                self._ps_history = history
        self.log(f"checkpoint: step {step} -> {path}")
        if on_ps:  # the snapshots every checkpoint names, the best one's too, stay
            metas = [ps_metas(r) for r in (ck.dir, self._best_root()) if r and Path(r).is_dir()]
            if all(m is not None for m in metas):
                self.path.prune([m for ms in metas for m in ms]  # type: ignore[union-attr]
                                + self._ps_history)
        return Path(path)

    def _best_root(self) -> Path | None:
        """Where ``train.keep_best`` keeps the best evaluation's checkpoint."""
        ck = self.cfg.train.checkpoint.dir
        return Path(ck) / BEST if ck and self.cfg.train.keep_best else None

    def resume(self, path: str) -> None:
        self._eval_at = None
        self._load(path)
        best = self._best_root()
        if self.early is not None and best is not None and (best / BEST_STATE).exists():
            self.early.load_state(json.loads((best / BEST_STATE).read_text()))

    def _load(self, path: str) -> None:
        """The state of the checkpoint at ``path`` (a directory, or a root with LATEST)."""
        meta = read_meta(path)
        if self.ranks is not None or "sharded" in meta:  # another layout: reshard the rows
            self._resume_resharded(resolve_checkpoint(path), meta)
            return
        ps_meta = meta.get("ps")
        if ps_meta is not None:  # (its path: named if the PS holds another run's rows)
            self._restore_ps({**ps_meta, "checkpoint": str(resolve_checkpoint(path))})
        self._ps_history = _history_at(ps_meta, int(meta["step"]))
        state, dense, tables, _ = load_checkpoint(path)
        self.model.load_state_dict(dense["model"])
        self.dense_opt.load_state_dict(dense["optimizer"])
        torch.set_rng_state(dense["torch_rng"])
        self.bad_records = int(dense.get("bad_records", 0))
        self.ec.load_rows(tables, state.step, rows_on_ps=ps_meta is not None)
        self.state = state
        if self.progressive is not None:  # on after the last file and row it trained
            self.train_reader.resume(state.stream)
        self.resumed = True
        self.log(f"resumed from {path}: step {state.step}, epoch {state.epoch}")

    def _resume_resharded(self, ck: Any, meta: dict[str, Any]) -> None:
        """Resume from a checkpoint of any world size and sharding: the PS comes back to the
        snapshots it names, each table this process holds is merged from the saved layout, and
        this process keeps its part. Architecture A's ranks hold no shards: rank 0 alone
        writes a checkpoint's rows to the shared PS."""
        ps_meta = meta.get("ps")
        if ps_meta is not None:
            self._restore_ps({**ps_meta, "checkpoint": str(ck)})
        self._ps_history = _history_at(ps_meta, int(meta["step"]))
        sharded = self.ranks is not None and self.ranks.plan is not None
        writes = self.ranks is None or sharded or self.ranks.world.leader
        saved = set(meta["sharded"]["tables"] if "sharded" in meta else meta["tables"])
        held = [t.name for t in self.shard_cfg.tables if writes and t.name in saved]
        if "sharded" in meta:
            whole = load_sharded_rows(ck, meta, self.cfg.tables, held)
            load_sharded_dense(ck, self.train_model, self.dense_opt)
        else:  # one process's checkpoint, onto many ranks
            if self.cfg.parallel.dense != "ddp":
                raise CheckpointError(f"{ck}: a one-process checkpoint resumes on many ranks "
                                      "with parallel.dense ddp")
            _, dense, whole, _ = load_checkpoint(ck)
            whole = {n: whole[n] for n in held}
            self.model.load_state_dict(dense["model"])
            self.dense_opt.load_state_dict(dense["optimizer"])
        if ps_meta is not None:  # a column shard's own PS table, from the whole one there
            for t in self.shard_cfg.tables:
                if t.name not in whole and t.remote_name != t.name:
                    whole[t.name] = self.path.read_ps_table(t.name)
        step = int(meta["step"])
        # what the checkpoint has no rows of is on the restored PS (A: rank 0 writes them there)
        on_ps = ps_meta is not None or (self.ranks is not None and not sharded)
        if sharded:
            assert self.ranks is not None and self.ranks.plan is not None
            mine = my_shards(whole, self.cfg.tables, self.ranks.plan, self.ranks.world.rank)
            self.ec.inner.load_rows(mine, step, rows_on_ps=on_ps)  # type: ignore[union-attr]
        else:
            self.ec.load_rows(whole, step, rows_on_ps=on_ps)
        if self.ranks:
            dist.barrier()  # (A: rank 0's rows are on the PS before any rank pulls them)
        self.state = TrainState(step, int(meta["epoch"]), int(meta["batch_in_epoch"]))
        self.resumed = True
        saved_on = meta.get("sharded", {}).get("world_size", 1)
        self.log(f"resumed from {ck}: step {step}, epoch {self.state.epoch} (saved on "
                 f"{saved_on} rank(s), resharded onto {self.ranks.world.size if self.ranks else 1})")

    def _restore_ps(self, ps_meta: dict[str, Any]) -> None:
        """The PS back at a checkpoint's snapshots: restarted from them here, or, on many
        ranks, by rank 0, whose new shards every other rank then reaches."""
        leader = self.ranks is None or self.ranks.world.leader
        endpoints = None
        if leader:
            try:
                rebuilt = self.path.restore(ps_meta)
            except BaseException as e:
                if self.ranks:  # the other ranks wait for the shards: tell them why not
                    share_ps(self.ranks, None, f"{type(e).__name__}: {e}")
                if isinstance(e, SnapshotMismatch):
                    raise CheckpointError(str(e)) from e
                raise
            endpoints = self.path.endpoints()
        if self.ranks:
            endpoints = share_ps(self.ranks, endpoints)
            if not leader:
                self.path.restore(ps_meta, endpoints)
            rebuilt = True
        if rebuilt:
            self._install_collection()

    # --- training -----------------------------------------------------------------------------
    def _train_step(self, prepared: PreparedBatch) -> float:
        """One step, top to bottom: the forward gathers the batch's planned rows, the loss is
        checked, backward, the dense optimizer, then the sparse one, which writes the rows'
        updates back to where they live (a PS push). Returns the loss."""
        batch = prepared.batch
        self.model.train()
        if self.model.dropout is not None:  # this step's masks: (train.seed, rank, step) only
            self.model.dropout.begin_step(self.state.step + 1,
                                          self.ranks.world.rank if self.ranks else 0)
        self.dense_opt.zero_grad(set_to_none=True)
        ec0 = dict(self.ec.stage_ms)
        t0 = time.perf_counter()
        logits = self.train_model(prepared)
        labels = batch.labels.to(self.device, non_blocking=True)
        if self.ranks:  # the global batch's loss, the same on every rank
            sizes = prepared.shard[1].sizes if prepared.shard is not None else None
            loss = global_bce(logits, labels, sizes, self.ranks.world)
        else:
            loss = F.binary_cross_entropy_with_logits(logits, labels)
        value = float(loss.detach())  # checked before any update is applied
        finite = math.isfinite(value)
        if self.progressive is not None and finite:  # the scores before this batch's update
            self.progressive.add(batch.labels.numpy(),
                                 torch.sigmoid(logits.detach()).float().cpu().numpy())
        t1 = time.perf_counter()
        if not finite and self.cfg.train.on_nonfinite == "stop":
            raise NonFiniteLoss(self.state.step + 1, value, self.state.epoch,
                                self.state.batch_in_epoch)
        if finite:
            loss.backward()
        t2 = time.perf_counter()
        if finite:
            self.dense_opt.step()
        # skip_batch: no backward, so no row has a gradient and apply_gradients updates nothing;
        # it still ends the batch (the planner's pins, the step count)
        self.ec.apply_gradients()
        t3 = time.perf_counter()
        ec = {k: self.ec.stage_ms[k] - ec0.get(k, 0.0) for k in ("gather", "writeback")}
        late = self.ec.stage_ms["fill"] - ec0.get("fill", 0.0) - prepared.fill_ms  # at the gather
        self._marks = {"forward": t0, "backward": t1, "optim": t2,
                       "writeback": t3 - ec["writeback"] / 1e3}
        self._stages = {  # (read: the prefetch wait, added by the caller)
            "featurize": batch.build_ms,
            "prep": prepared.prep_ms,
            "plan": prepared.plan_ms - prepared.fill_ms,
            "fill": prepared.fill_ms + late,
            "gather": ec["gather"],
            "forward": (t1 - t0) * 1e3 - ec["gather"] - late,
            "backward": (t2 - t1) * 1e3,
            "optim": (t3 - t2) * 1e3 - ec["writeback"],
            "writeback": ec["writeback"],
        }
        return value

    def run(self, steps: int | None = None, evaluate: bool = True) -> dict[str, Any]:
        """Train up to ``steps`` in all (default: ``train.steps`` and ``train.epochs``, the first
        reached, through ``run_limits``), or until early stopping
        stops it; evaluate at the end unless ``evaluate`` is False (a part of a run, such as a
        warm-up: then early stopping keeps no best either). Returns the run summary
        (``cosparse.train.summary``: this call's whole-run figures, the last interval's under
        ``last_interval``), the evaluation, and early stopping's figures."""
        if not self.resumed:  # a fresh run on an earlier run's PS snapshots would train on them
            self.path.refuse_stale()
        step_limit, epochs = run_limits(self.cfg.train)
        total = steps if steps is not None else step_limit  # None: epochs alone limit the run
        cfg = self.cfg
        stats = IntervalStats()
        summary = RunSummary(max(0, cfg.train.timing_warmup_steps - self._trained_here))
        self.interval_counters = IntervalCounters(self.ec, self.path, self.wire_bytes)
        run_counters = IntervalCounters(self.ec, self.path, self.wire_bytes)
        waits0, step0 = waits.snapshot(), self.state.step
        if self.ranks:
            self._comm_seen["run"] = self._comm_now()
        follower = self.ranks is not None and not self.ranks.world.leader  # rank 0's bar only
        bar = tqdm(
            total=total, initial=self.state.step, disable=not cfg.train.progress or follower,
            unit="step",
            dynamic_ncols=True, desc=self.bar_desc, position=self.bar_position,
        )
        last: dict[str, Any] = {}
        try:
            while ((total is None or self.state.step < total) and self.state.epoch < epochs
                   and not self._stop_early and not self._stream_ended):
                stream = self._open_stream()
                self.stream = stream
                self.data_worker_pids.update(stream.pids)
                # never plan past the last step: planning pulls rows (a PS creates the rows it is
                # asked for), so batches planned but never trained would leave extra rows behind,
                # as many as the prefetch thread happened to reach
                steps_left = itertools.islice(
                    self._mine(stream), None if total is None else total - self.state.step)
                staged = self.ec.staged(steps_left, cfg.supply.horizon)
                self.ec.planner.watch(self.progress, cfg.train.stall_timeout_s)
                prefetch = Prefetcher(staged, lambda prepared: prepared, cfg.supply.lookahead,
                                      cfg.train.stall_timeout_s)
                if cfg.data.stream is not None:  # waiting for files is progress, not a stall
                    self.train_reader.heartbeat = self._beater(prefetch)
                failure: str | None = None
                keep = False  # (the stream goes on into the next run when this one ends here)
                try:
                    for prepared in prefetch:
                        last = self._one_step(prepared, prefetch, stats, summary, bar,
                                              total) or last
                        if (total is not None and self.state.step >= total) \
                                or self._stop_early:
                            keep = not self._stop_early
                            break
                        failure = self.path.health()
                        if failure is not None or self._pending is not None:
                            break
                    else:
                        if cfg.data.stream is not None:  # a stream is one epoch: its end ends the run
                            self._stream_ended = True
                        else:
                            self.state.epoch += 1
                            self.state.batch_in_epoch = 0
                except (WorkerExited, *self.path.stream_errors) as e:
                    if self.path.delivery is None:  # not the workers' rows: nothing to fall back
                        raise
                    failure = str(e)
                finally:
                    self.ec.planner.cancel()
                    if cfg.data.stream is not None:  # (its thread may be waiting for files)
                        stream.close()
                    prefetch.close()
                    if keep and self.stream_factory is None and cfg.data.stream is None:
                        self._kept = (stream, self.state.epoch, self.state.batch_in_epoch)
                    else:
                        stream.close()
                    self.ec.planner.reset(self.state.step)
                if failure is not None:
                    self.path.fall_back(failure, self.state.step)
                    self.recorder.fallback(failure)
                elif self._pending is not None:
                    self._reconfigure(self._pending)
        finally:
            bar.close()
        if steps is None and cfg.train.steps is not None and cfg.train.epochs is not None:
            self._log_limit_reached(cfg.train.steps, cfg.train.epochs)
        if stats.steps:
            last = self._log_interval(stats, None)
        final = {**summary.figures(),
                 **self._counter_figures(run_counters, summary.steps, "run"),
                 **self._cumulative()}
        final["last_interval"] = {k: v for k, v in last.items() if k != "kind"} or None
        final.update(self._end_of_run_scores() if evaluate else {})
        final["step"] = self.state.step
        final["cpu"] = {**dataclasses.asdict(self.cpu),  # the thread budget the run trained under
                        **omp_wait.state()}
        # the hand-offs between its threads and processes that had to block, per step
        final["sync"] = waits.snapshot().since(waits0).per_step(self.state.step - step0)
        if self.ranks:
            final["world_size"] = self.ranks.world.size
        self.sink.write({**final, "kind": "final"})
        return final

    def _end_of_run_scores(self) -> dict[str, Any]:
        """The evaluation at the end (the one already run at this step, if any). With early
        stopping it is judged too, and with ``train.keep_best`` the run ends on its best
        evaluation: that state restored and saved as the final checkpoint."""
        scores = self._evaluate_once()
        if self.early is None:
            return scores
        self._judge(scores, can_stop=False)
        out = {**scores, **self.early.figures()}
        best = self.early.best_step
        if self.cfg.train.keep_best and best is not None:
            restored = best != self.state.step
            if restored:  # the checkpoint machinery brings back every placement's state
                self.log(f"keep_best: restoring the best evaluation, step {best} "
                         f"({self.early.cfg.metric} {self.early.best_value:.6f})")
                self._load(str(self._best_root()))
                self._eval_at = (self.state.step, dict(self.early.best_scores))
            saved = self._saved
            path = saved[1] if saved is not None and saved[0] == self.state.step else self.save()
            self.log(f"keep_best: the run ends on its best evaluation (step {best}); "
                     f"final checkpoint {path}")
            out = {**out, **self.early.best_scores, "best_checkpoint": str(path),
                   "best_restored": restored}
        self.log(self.early.describe())
        return out

    def _open_stream(self) -> Any:
        """The data stream from the current batch on: the one the last run left open when it
        stands there (its workers are warm and have read ahead), else a new one."""
        kept, self._kept = self._kept, None
        if kept is not None:
            stream, epoch, batch = kept
            if (epoch, batch) == (self.state.epoch, self.state.batch_in_epoch) \
                    and not stream.closed:
                return stream
            stream.close()  # (a restore moved the position)
        if self.stream_factory:
            return self.stream_factory(self.state.batch_in_epoch)
        cfg = self.cfg
        return BatchStream(
            self.train_reader, cfg.data.workers, cfg.data.queue_depth,
            start_batch=self.state.batch_in_epoch, codec=self.path.codec,
            link=self.links.worker_trainer, preload=WORKER_PRELOAD,
        )

    def _mine(self, batches: Any) -> Any:
        """This rank's samples of each global batch (all of them on one process)."""
        if self.ranks is None:
            return batches
        return local_parts(batches, self.ranks.world.rank, self.ranks.world.size,
                           self.ranks.balance)

    def _log_limit_reached(self, steps: int, epochs: int) -> None:
        """Given both ``train.steps`` and ``train.epochs``: which one ended the run."""
        st = self.state
        if st.step >= steps:
            self.log(f"train.steps ({steps}) reached at epoch {st.epoch + (st.batch_in_epoch > 0)}"
                     f" of train.epochs ({epochs}): the run ends at step {st.step}")
        elif st.epoch >= epochs:
            self.log(f"train.epochs ({epochs}) reached at step {st.step}, before train.steps "
                     f"({steps}): the run ends")

    def _one_step(self, prepared: PreparedBatch, prefetch: Prefetcher, stats: IntervalStats,
                  summary: RunSummary, bar: tqdm, total: int | None) -> dict[str, Any] | None:
        """Train one prepared batch, then log, checkpoint and evaluate when due (and stop
        early when early stopping says so)."""
        cfg = self.cfg
        loss = self._train_step(prepared)
        self.losses.append(loss)
        skipped = not math.isfinite(loss)  # (train.on_nonfinite: skip_batch; stop raised)
        if skipped:
            self.skipped_batches += 1
            self.log(f"step {self.state.step + 1}: the loss is {loss}; batch skipped, no update "
                     "applied (train.on_nonfinite: skip_batch)")
        self.bad_records += prepared.batch.bad_records
        self.wire_bytes += prepared.batch.wire_bytes
        self.features_computed += prepared.batch.features_computed
        self.state.step += 1
        self.state.batch_in_epoch += 1
        if self.progressive is not None:
            self.state.stream = self.train_reader.position_after(prepared.batch.index)
        self._trained_here += 1
        self.progress.beat(f"trained step {self.state.step}")
        self.path.on_step(self.state.step)
        wait = prefetch.last_wait  # this batch's (a wait, from the step before's end)
        read = (wait[1] - wait[0]) * 1e3
        inline = cfg.supply.lookahead == 0  # (then the wait prepared and planned the batch)
        if inline:
            read = max(0.0, read - prepared.prep_ms - prepared.plan_ms)
        stages = dict(self._stages, read=read)
        t_end = time.perf_counter()
        step_ms = (t_end - wait[0]) * 1e3
        self.recorder.step(self.state.step, wait, t_end, stages, self._marks, prepared, loss,
                           "trainer" if inline else "prefetch/planner")
        self.health.observe({n: prepared.tables[n].unique for n in self._cached()
                             if n in prepared.tables})
        stats.add_step(prepared.batch.batch_size, loss, step_ms, stages, skipped=skipped)
        summary.add_step(prepared.batch.batch_size, loss, step_ms, stages, skipped=skipped)
        bar.update(1)
        last = None
        if self.state.step % cfg.train.log_every == 0 or self.state.step == total:
            last = self._log_interval(stats, bar)
        ck = cfg.train.checkpoint
        if (ck.every and self.state.step % ck.every == 0) or \
                (ck.every_s and time.monotonic() - self._saved_at >= ck.every_s):
            self.save()
        step = self.state.step
        periodic = bool(cfg.train.eval_every) and step % cfg.train.eval_every == 0
        judged = self.early is not None and self.early.due(step)
        if periodic or judged:  # one evaluation serves both
            scores = self._evaluate_once()
            if judged:
                self._judge(scores, can_stop=True)
        return last

    def _evaluate_once(self) -> dict[str, Any]:
        """The evaluation of the current state: run once per step, however many ask."""
        if self._eval_at is None or self._eval_at[0] != self.state.step:
            self._eval_at = (self.state.step, self.evaluate())
        return self._eval_at[1]

    def _judge(self, scores: dict[str, Any], can_stop: bool) -> None:
        """Early stopping's view of the evaluation at this step (once per step): keep a new
        best (``train.keep_best``), and stop when patience has run out."""
        assert self.early is not None
        step = self.state.step
        if self._observed_step == step:
            return
        self._observed_step = step
        verdict = self.early.observe(step, scores, can_stop=can_stop)
        if verdict.improved and self._best_root() is not None:
            self._save_best()
        if verdict.stop:
            self._stop_early = True
            self.log(f"early stopping at step {step}: {self.early.cfg.metric} has not improved "
                     f"for {self.early.cfg.patience} evaluations (best "
                     f"{self.early.best_value} at step {self.early.best_step})")

    def _save_best(self) -> None:
        """The best evaluation's checkpoint (one kept) and what early stopping knew then."""
        root = self._best_root()
        assert root is not None and self.early is not None
        self.save(str(root), keep=1)
        if self.ranks is None or self.ranks.world.leader:
            tmp = root / f".{BEST_STATE}.tmp"
            tmp.write_text(json.dumps(self.early.state(), sort_keys=True))
            os.replace(tmp, root / BEST_STATE)

    def _cumulative(self) -> dict[str, Any]:
        """The run's counts so far (not deltas): bad records, skipped batches, features
        computed, distinct IDs per table."""
        out: dict[str, Any] = {"bad_records": self.bad_records,
                               "skipped_batches": self.skipped_batches}
        if self.cfg.features.spec and self.stream_factory is None:  # (a shared stream counts)
            out["features.computed"] = self.features_computed
        for name, n in self.ec.unique_ids.items():
            out[f"unique_ids.{name}"] = n
        return out

    def _counter_figures(self, counters: IntervalCounters, steps: int,
                         baseline: str) -> dict[str, Any]:
        """The link, supply and tier counters' change since ``counters`` last took them; on
        many ranks every link's bytes summed over the ranks, and the ranks' own link since
        ``baseline`` (``interval`` or ``run``)."""
        out: dict[str, Any] = counters.take(self.wire_bytes)
        if self.ranks:
            mine = {k: float(v or 0) for k, v in out.items() if k.startswith("bytes.")}
            everyone: list[Any] = [None] * self.ranks.world.size
            torch.distributed.all_gather_object(everyone, mine)  # (ranks hold other tables)
            totals: dict[str, float] = {}
            for theirs in everyone:
                for k, v in theirs.items():
                    totals[k] = totals.get(k, 0.0) + v
            out.update(totals)
            out.update(self._rank_rank(steps, baseline))
        return out

    def _log_interval(self, stats: IntervalStats, bar: tqdm | None) -> dict[str, Any]:
        rec = {"kind": "train", "step": self.state.step, **stats.summary(), **self._cumulative()}
        rec.update(self._counter_figures(self.interval_counters, stats.steps, "interval"))
        samples = {f"stage_ms.{k}": v for k, v in stats.stage_samples().items()}
        ps = {f"ps_ms.{k}": v for k, v in self.recorder.ps_latency_samples().items()}
        rec.update(latency_figures(ps))
        rec.update(self.health.judge(rec, self._cached()))
        self.sink.write(rec)
        self.sink.histograms("train", self.state.step, {**samples, **ps})
        if self.on_interval is not None:
            answer = self.on_interval(rec)
            if answer is not None and answer.changes:
                self._pending = answer
        if bar is not None:
            bar.set_postfix(loss=f"{rec['loss']:.4f}", samples_s=f"{rec['samples_per_s']:,.0f}")
            if bar.disable:
                self.log(
                    f"step {rec['step']}: loss {rec['loss']:.4f}, "
                    f"{rec['samples_per_s']:,.0f} samples/s"
                )
        stats.reset()
        return rec

    def _cached(self) -> dict[str, int]:
        """Each tiered table's device rows (the tables whose device hit rate means something)."""
        return {name: t.dev.limit for name, t in getattr(self.ec, "tables", {}).items()
                if isinstance(t, TieredTable)}

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

    def _comm_now(self) -> tuple[float, float]:
        """This rank's cumulative bytes sent to other ranks and time waited in collectives."""
        comm = self.ranks.world.comm  # type: ignore[union-attr]
        return float(comm["sent_bytes"]), float(comm["wait_ms"])

    def _rank_rank(self, steps: int, baseline: str) -> dict[str, float]:
        """Since ``baseline`` (the last interval, or the run's start): the bytes all ranks
        sent each other (summed over ranks), and the slowest rank's time in the collectives
        per step."""
        now = self._comm_now()
        seen = self._comm_seen.get(baseline, (0.0, 0.0))
        self._comm_seen[baseline] = now
        sent = torch.tensor([now[0] - seen[0]], dtype=torch.float64)
        torch.distributed.all_reduce(sent)
        wait = torch.tensor([now[1] - seen[1]], dtype=torch.float64)
        torch.distributed.all_reduce(wait, op=torch.distributed.ReduceOp.MAX)
        n = max(1, steps)
        return {"bytes.rank_rank": float(sent), "bytes.rank_rank_per_step": float(sent) / n,
                "collectives_ms_per_step": float(wait) / n}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """AUC and log loss over the whole eval split (the tables are not modified); of a
        stream, over its progressive-validation window (``cosparse.train.progressive``)."""
        if self.progressive is not None:
            return self._progressive_scores()
        self.model.eval()
        scores, labels = [], []
        with BatchStream(self.eval_reader, self.cfg.data.workers, self.cfg.data.queue_depth,
                         preload=WORKER_PRELOAD) as s:
            want = self.cfg.data.eval_batch_size or max(self.cfg.data.batch_size, 1024)
            for batch in self._mine(joined_batches(s, want)):
                self.progress.beat(f"evaluating at step {self.state.step}")
                logits = self.model(self.ec.prepare(batch))
                scores.append(torch.sigmoid(logits).float().cpu().numpy())
                labels.append(batch.labels.numpy())
        self.model.train()
        if self.ranks:  # every rank scored its samples: all of them, in global order
            mine = [(np.concatenate(labels) if labels else np.zeros(0, np.float32),
                     np.concatenate(scores) if scores else np.zeros(0, np.float32))]
            everyone: list[Any] = [None] * self.ranks.world.size
            torch.distributed.all_gather_object(everyone, mine[0])
            labels = [y for y, _ in everyone]
            scores = [p for _, p in everyone]
            if not sum(y.shape[0] for y in labels):
                return {}
        if not scores:
            return {}
        y, p = np.concatenate(labels), np.concatenate(scores)
        out = {"auc": roc_auc(y, p), "logloss": log_loss(y, p), "eval_samples": int(y.shape[0])}
        self.sink.write({"kind": "eval", "step": self.state.step, **out})
        self.log(
            f"eval @ step {self.state.step}: auc {out['auc']:.4f}, logloss {out['logloss']:.4f} "
            f"({out['eval_samples']} samples)"
        )
        return out

    def _beater(self, prefetch: Prefetcher) -> Callable[[str], None]:
        """A stream's heartbeat while it waits for files: the prefetch thread's and the
        trainer's progress (the waits on either see a live run)."""
        mine = self.progress  # (not the trainer itself: the reader keeps this, no cycle)

        def beat(what: str) -> None:
            prefetch.progress.beat(what)
            mine.beat(what)
        return beat

    def _progressive_scores(self) -> dict[str, Any]:
        """The progressive-validation window's scores, written as an eval record."""
        assert self.progressive is not None
        out: dict[str, Any] = self.progressive.scores()
        if not out:
            return {}
        out["progressive"] = True
        self.sink.write({"kind": "eval", "step": self.state.step, **out})
        self.log(f"eval @ step {self.state.step} (progressive, last {out['eval_samples']} "
                 f"samples): auc {out['auc']:.4f}, logloss {out['logloss']:.4f}")
        return out

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


def _history_at(ps_meta: dict[str, Any] | None, step: int) -> list[dict[str, Any]]:
    """The PS snapshot history a resumed run goes on from: the saves up to its step (later
    ones were another branch's)."""
    return [h for h in (ps_meta or {}).get("history", []) if int(h["step"]) <= step]
