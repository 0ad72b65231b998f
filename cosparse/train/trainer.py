"""Trainer: the training loop (prefetch, forward/backward, sparse and dense optimizer steps) and
the run around it (limits, logging, checkpoint and evaluation points, fallback, close).

How rows reach the trainer is the supply path's business (``cosparse.supply``: resident or
tiered rows, ps-direct, collaborative); the trainer builds the path the config names, asks it
for each table's placement, and calls it at each step, checkpoint and log point.
One training step reads top to bottom in ``_train_step``. The trainer's other roles are mixed in
from their own modules: set-up (``trainer_setup``), checkpoints (``trainer_checkpoints``),
evaluation (``trainer_evaluation``), interval records (``trainer_reporting``), the data stream
(``trainer_stream``) and live knobs (``trainer_reconfigure``).
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from cosparse import waits
from cosparse.config import Config, ConfigError
from cosparse.config.objective import check_group_by, objective_of
from cosparse.config.train import run_limits
from cosparse.data.pool import WorkerExited
from cosparse.link import Links
from cosparse.models.builtin import build_model
from cosparse.nn.types import PreparedBatch
from cosparse.parallel.dense import dense_parallel, sum_fsdp2_gradients
from cosparse.parallel.engine import RankSetup, reach_shared_ps, share_ps, start_rank
from cosparse.parallel.world import launched_by_torchrun
from cosparse.stall import Progress
from cosparse.supply.paths import make_supply_path
from cosparse.supply.types import PathContext
from cosparse.train.checkpoint import TrainState
from cosparse.train.cpu_budget import apply_cpu, cpu_shares
from cosparse.train.data_notes import data_notes
from cosparse.train.dense import make_dense_optimizer, pick_device, warm_up_vector_math
from cosparse.train.din_overlap import warn_din_without_overlap
from cosparse.train.early_stop import EarlyStopper
from cosparse.train.health import HealthMonitor
from cosparse.train.inputs import ModelInputs, check_table_features, model_inputs
from cosparse.train.leftovers import sweep_dead_runs
from cosparse.train.live import Reconfigure
from cosparse.train.metrics import IntervalCounters, IntervalStats, MetricsSink
from cosparse.train.nonfinite import NonFiniteLoss
from cosparse.train.objective import objective_loss
from cosparse.train.prefetch import Prefetcher
from cosparse.train.progressive import ProgressiveWindow
from cosparse.train.sizing import SizingReport
from cosparse.train.step_records import StepRecorder, steps_path
from cosparse.train.summary import RunSummary
from cosparse.train.trainer_checkpoints import CheckpointRole
from cosparse.train.trainer_evaluation import EvaluationRole
from cosparse.train.trainer_reconfigure import ReconfigureRole
from cosparse.train.trainer_reporting import ReportingRole
from cosparse.train.trainer_setup import SetupRole
from cosparse.train.trainer_stream import StreamRole
from cosparse.tune.hotness import table_hotness


class Trainer(SetupRole, CheckpointRole, EvaluationRole, ReportingRole, StreamRole,
              ReconfigureRole):
    """Trains ``cfg.model`` on ``cfg.data``; ``run`` returns the final metrics."""

    def __init__(self, cfg: Config, log: Callable[[str], None] | None = None,
                 inputs: ModelInputs | None = None,
                 stream_factory: Callable[[int], Any] | None = None,
                 on_interval: Callable[[dict[str, Any]], Reconfigure | None] | None = None,
                 model: torch.nn.Module | None = None) -> None:
        """``inputs``: the readers (default: from ``cfg.data`` and ``cfg.features``);
        ``stream_factory(start_batch)``: the training batches of an epoch, instead of a data
        stream of this trainer's own (a multi-model run hands each model its view);
        ``on_interval(record)``: called with every interval's metrics, as they are written
        (what a tuning agent watches a run through); it may answer with live knobs to change,
        which apply before the next batch (``cosparse.train.live``); ``model``: the module to
        train (an ``EngineModel``, ``cosparse.nn.engine_model``: a model on the public API as
        the trainer drives it; default: ``model.kind``'s, ``cosparse.models.builtin``)."""
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
        self.objective = objective_of(cfg.objective)  # (None: one binary task, label)
        check_group_by(self.objective, list(self.train_reader.keys))
        for note in data_notes(cfg, self.train_reader):
            self.log(note)
        self.model = (build_model(cfg, self.train_reader.num_dense, self.device)
                      if model is None else model.to(self.device))
        self.links = Links.from_config(cfg.network)
        # many ranks (torchrun): this rank's shards are the tables its supply path places
        self.ranks: RankSetup | None = None
        if launched_by_torchrun() and int(os.environ["WORLD_SIZE"]) > 1:
            self.ranks = start_rank(cfg, self.device, self._probe, self.log, table_hotness(cfg))
            if not self.ranks.world.leader:
                self.log = lambda msg: None
        warn_din_without_overlap(cfg, self.train_reader, self.log)
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

    # --- checkpoints --------------------------------------------------------------------------
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
        # the objective's loss; on many ranks the global batch's, the same on every rank
        sizes = prepared.shard[1].sizes if self.ranks and prepared.shard is not None else None
        loss = objective_loss(self.objective, logits, batch, self.device,
                              self.ranks.world if self.ranks else None, sizes)
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
        return self._final_record(summary, run_counters, last, evaluate, waits0, step0)

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
