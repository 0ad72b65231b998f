"""Trainer: the training loop (data stream, prefetch, forward/backward, sparse and dense optimizer
steps), evaluation, progress, metrics and checkpoints.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numba
import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from cosparse.batch import SparseBatch, concat_batches
from cosparse.config import Config, ConfigError
from cosparse.data import BatchStream
from cosparse.data.pool import WorkerExited
from cosparse.link import Links
from cosparse.nn.embedding import EmbeddingCollection, PreparedBatch
from cosparse.nn.models import build_model
from cosparse.owner import owner_tag
from cosparse.ps import snapshots
from cosparse.ps.client import PSClient
from cosparse.ps.discovery import discover, store_address_from_env
from cosparse.ps.embedded import EmbeddedShards
from cosparse.stall import Progress
from cosparse.supply.collaborative import (
    CollaborativeCodec,
    CollaborativeSupply,
    DeliveryError,
    SupplyFailure,
)
from cosparse.supply.collaborative.resident_filter import FilterLayout
from cosparse.supply.collaborative.shared_batch import shared_dir
from cosparse.supply.collaborative.types import SupplyCounters
from cosparse.supply.collaborative.worker import TableKeys, WorkerPS
from cosparse.supply.collaborative.writeback_log import LoggedRemote
from cosparse.train.checkpoint import (
    CheckpointError,
    TrainState,
    checkpoints,
    load_checkpoint,
    read_meta,
    save_checkpoint,
)
from cosparse.train.evaluate import log_loss, roc_auc
from cosparse.train.inputs import ModelInputs, model_inputs
from cosparse.train.leftovers import earlier_snapshots, stale_snapshots_error, sweep_dead_runs
from cosparse.train.metrics import IntervalStats, MetricsSink
from cosparse.train.nonfinite import NonFiniteLoss
from cosparse.train.prefetch import Prefetcher
from cosparse.train.sizing import SizingReport, describe, measure_dense_bytes, size_tiers


def pick_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device: 'cuda' requested but no CUDA device is available")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def make_dense_optimizer(cfg: Config, params) -> torch.optim.Optimizer:
    o = cfg.model.dense_optimizer
    if o.kind == "adagrad":
        return torch.optim.Adagrad(params, lr=o.lr)
    if o.kind == "adam":
        return torch.optim.Adam(params, lr=o.lr)
    return torch.optim.SGD(params, lr=o.lr)


class Trainer:
    """Trains ``cfg.model`` on ``cfg.data``; ``run`` returns the final metrics."""

    def __init__(self, cfg: Config, log: Callable[[str], None] | None = None,
                 inputs: ModelInputs | None = None,
                 stream_factory: Callable[[int], Any] | None = None) -> None:
        """``inputs``: the readers (default: from ``cfg.data`` and ``cfg.features``);
        ``stream_factory(start_batch)``: the training batches of an epoch, instead of a data
        stream of this trainer's own (a multi-model run hands each model its view)."""
        self.log = log or (lambda msg: tqdm.write(msg))
        swept = sweep_dead_runs(cfg)  # what runs that are gone left: never a live run's
        if swept:
            self.log(f"swept {len(swept)} leftovers of runs that are gone: "
                     f"{', '.join(str(p) for p in swept[:5])}{' ...' if len(swept) > 5 else ''}")
        self._earlier_snapshots: dict[str, str] = {}  # refused at run() unless resumed
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
            numba.set_num_threads(min(cfg.train.threads, numba.config.NUMBA_NUM_THREADS))
        torch.manual_seed(cfg.train.seed)
        self.device = pick_device(cfg.train.device)
        self.inputs = inputs or model_inputs(cfg)
        self.cfg = cfg = self.inputs.cfg
        self.stream_factory = stream_factory
        self.bar_desc: str | None = None  # the progress bar's label and row (several models)
        self.bar_position: int | None = None
        self.train_reader = self.inputs.train
        self.eval_reader = self.inputs.eval
        keys = set(self.train_reader.keys)
        source = (f"feature consumer '{cfg.features.consumer}'" if cfg.features.spec
                  else f"data.reader '{cfg.data.reader}'")
        for i, t in enumerate(cfg.tables):
            for f in t.features:
                if f not in keys:
                    raise ConfigError(
                        f"tables[{i}].features: feature '{f}' is not produced by {source} "
                        f"(it has {', '.join(self.train_reader.keys)})"
                    )
        self.model = build_model(cfg, self.train_reader.num_dense, self.device)
        self.sizing: SizingReport | None = None
        self.shards: EmbeddedShards | None = None
        self.ps: PSClient | None = None
        self._remote_tier = cfg.store.host.spill and cfg.store.host.spill_to == "remote"
        self.links = Links.from_config(cfg.network)
        self.supply: CollaborativeSupply | None = None
        self.codec: CollaborativeCodec | None = None
        self._shm_dir: str | None = None
        self.fallbacks: list[str] = []
        self.supply_counters = SupplyCounters()  # across fallbacks and shard restarts
        if cfg.store.tiered:
            self._install_tiers()
        if cfg.supply.path == "ps-direct" or self._remote_tier:
            self._install_ps()
        self.ec = self.model.ec
        self.dense_opt = make_dense_optimizer(cfg, list(self.model.parameters()))
        self.state = TrainState(step=0, epoch=0, batch_in_epoch=0)
        self.sink = MetricsSink(cfg.train.metrics_json, cfg.train.tensorboard_dir)
        self.losses: list[float] = []
        self.bad_records = 0
        self.skipped_batches = 0  # batches whose loss was not finite (train.on_nonfinite)
        self.wire_bytes = 0  # bytes of every batch message on the worker->trainer link
        self.features_computed = 0  # feature computations behind the batches trained
        self.delivering_pids: set[int] = set()  # processes whose PS pulls delivered rows
        self.data_worker_pids: set[int] = set()  # every data-worker process started
        self.progress = Progress("the trainer")  # what the planner and prefetch waits watch
        self._saves = 0  # checkpoints this process committed

    def _install_tiers(self) -> None:
        """Dense first, sparse the rest: size the tiers from a dry run and the first batches."""
        cfg = self.cfg
        tasks = self.train_reader.tasks()
        probe = [self.train_reader.build(t) for t in itertools.islice(tasks, cfg.store.probe_batches)]
        if hasattr(tasks, "close"):
            tasks.close()
        dense = 0
        if cfg.store.device.budget_bytes is not None:
            dense = measure_dense_bytes(self.model, probe[0], cfg.model.dense_optimizer.kind)
        self.sizing = size_tiers(cfg, probe, dense)
        self.log(describe(self.sizing))
        if cfg.supply.path == "ps-direct" or self._remote_tier:
            return  # the PS-backed collection is built with the client (_install_ps)
        self.model.ec = EmbeddingCollection(
            cfg.tables, self.device, cfg.store.device.budget_bytes,  # type: ignore[arg-type]
            tiers=self.sizing.plans, lookahead=cfg.supply.lookahead,
            admit_after=cfg.store.admit_after,
        )

    def _install_ps(self) -> None:
        """Architecture A: start (or reach) the PS shards and serve every table from them."""
        cfg, remote = self.cfg, self.cfg.store.remote
        try:
            if remote.embedded:
                data_dir = remote.data_dir
                if data_dir is None:
                    data_dir = self._ps_tmp = tempfile.mkdtemp(prefix=f"cosparse-ps-{owner_tag()}-")
                self._earlier_snapshots = earlier_snapshots(cfg)
                self.shards = EmbeddedShards(remote.num_shards, cfg.tables, data_dir,
                                             auth_key_file=remote.auth_key, max_rows=remote.max_rows)
                self.ps = self.shards.client(remote.timeout_s, remote.heartbeat_s, self.links.trainer_ps)
            else:
                endpoints = remote.endpoints
                if remote.discovery == "tcpstore":
                    address = remote.tcpstore or store_address_from_env()
                    if address is None:
                        raise ConfigError("store.remote.tcpstore: not set and MASTER_ADDR/"
                                          "MASTER_PORT are not in the environment (not torchrun)")
                    endpoints = discover(address, remote.num_shards, remote.timeout_s)
                self.ps = PSClient(endpoints, remote.timeout_s, remote.heartbeat_s,
                                   auth_key=remote.auth_key, link=self.links.trainer_ps)
                self.ps.register(cfg.tables)
        except BaseException:
            self.close()
            raise
        self.model.ec = self._ps_collection()
        where = (f"{remote.num_shards} embedded shards" if remote.embedded
                 else f"{self.ps.num_shards} shards")
        role = {"ps-direct": "supply ps-direct", "collaborative": "supply collaborative (workers "
                "deliver cold rows)"}.get(cfg.supply.path, "remote tier below host")
        self.log(f"{role}: {where} at {', '.join(self.ps.endpoints)}")

    def _ps_collection(self) -> EmbeddingCollection:
        """The collection over the PS: architecture A, or tiers whose lowest level is the PS."""
        cfg = self.cfg
        arch_a = cfg.supply.path == "ps-direct"
        collaborative = cfg.supply.path == "collaborative" and not self.fallbacks
        remote = LoggedRemote(self.ps) if collaborative else self.ps
        ec = EmbeddingCollection(
            cfg.tables, self.device, cfg.store.device.budget_bytes,  # type: ignore[arg-type]
            tiers=self.sizing.plans if self.sizing else None, lookahead=cfg.supply.lookahead,
            admit_after=cfg.store.admit_after,
            ps_client=self.ps if arch_a else None, remote_tier=None if arch_a else remote,
        )
        if cfg.train.check_versions:  # debug: every row checked against the PS before it trains
            from cosparse.supply.ps_direct import enable_version_checks

            enable_version_checks(ec.tables.values())
        if collaborative:
            self._start_collaborative(ec, remote)  # type: ignore[arg-type]
        return ec

    def _start_collaborative(self, ec: EmbeddingCollection, remote: LoggedRemote) -> None:
        """Architecture B: publish the resident filter, and have the data workers bring the
        rows it does not hold over their own PS connections."""
        cfg, sp = self.cfg, self.cfg.supply
        self._stop_collaborative()
        if self._shm_dir is None:
            self._shm_dir = shared_dir("cosparse-b-")
        assert self.sizing is not None and self.ps is not None
        capacity = {n: p.device_rows + (p.host_rows or 0) for n, p in self.sizing.plans.items()}
        layout = FilterLayout.sized(os.path.join(self._shm_dir, "resident.filter"), capacity,
                                    sp.filter_bits_per_row)
        self.supply = ec.supply = CollaborativeSupply(ec.tables, remote, layout, sp.publish_every,
                                                      sp.publish_timeout_s, sp.max_stale_rate,
                                                      self.supply_counters)
        keys = [TableKeys(t.name, tuple(t.features), t.hash_size) for t in cfg.tables]
        remote_cfg = cfg.store.remote
        ps = WorkerPS(tuple(self.ps.endpoints), remote_cfg.timeout_s, remote_cfg.heartbeat_s,
                      remote_cfg.auth_key, self.links.worker_ps)
        self.codec = CollaborativeCodec(self.train_reader, keys, ps, layout, self._shm_dir)

    def _stop_collaborative(self) -> None:
        if self.supply is not None:
            self.supply.close()
            self.supply = None
        self.codec = None
        if getattr(self, "ec", None) is not None:
            self.ec.supply = None

    def _fall_back(self, reason: str) -> None:
        """Switch from the collaborative path to the trainer's own pulls (ps-direct supply),
        keeping the tiers: the batches not yet trained are planned again from the PS."""
        self.fallbacks.append(reason)
        self._stop_collaborative()
        self.log(f"supply: falling back to ps-direct at step {self.state.step}: {reason}")

    # --- checkpoints --------------------------------------------------------------------------
    @property
    def _ps_durable(self) -> bool:
        """The shards keep their snapshots where a later run finds them (not a temporary dir)."""
        remote = self.cfg.store.remote
        return self.ps is not None and (not remote.embedded or remote.data_dir is not None)

    def save(self) -> None:
        """Checkpoint atomically. With durable PS shards, the shards snapshot their rows and the
        trainer's checkpoint records those snapshots: both parts commit with one step number or
        neither does. Otherwise the PS rows are read into the trainer's checkpoint."""
        ck = self.cfg.train.checkpoint
        dense = {
            "model": self.model.state_dict(),
            "optimizer": self.dense_opt.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "bad_records": self.bad_records,
        }

        def snapshot_shards() -> dict[str, Any]:
            assert self.ps is not None
            self.progress.beat(f"checkpoint at step {self.state.step}: PS snapshots")
            # a full snapshot every `keep` saves, so pruning can drop the chains before it
            full = self._saves % max(1, ck.keep) == 0
            names = self.ps.snapshot(incremental=ck.incremental and not full)
            return {"ps": {"num_shards": self.ps.num_shards, "step": self.state.step,
                           "snapshots": [names[i] for i in range(self.ps.num_shards)]}}

        self.progress.beat(f"checkpoint at step {self.state.step}: exporting rows")
        try:
            path = save_checkpoint(
                ck.dir,  # type: ignore[arg-type]
                self.state,
                dense,
                self.ec.export_rows(skip_ps=self._ps_durable),
                dataclasses.asdict(self.cfg),
                keep=ck.keep,
                before_commit=snapshot_shards if self._ps_durable else None,
            )
        except OSError as e:  # disk full, quota, I/O error: nothing of this save is committed
            raise CheckpointError(
                f"writing the checkpoint of step {self.state.step} under {ck.dir} failed: "
                f"{e.strerror or e}; nothing of it was committed and the previous checkpoint "
                "is intact (free disk space, then rerun with --resume)"
            ) from e
        self._saves += 1
        self.log(f"checkpoint: step {self.state.step} -> {path}")
        self._prune_snapshots()

    def _prune_snapshots(self) -> None:
        """Keep the PS snapshots that the checkpoints on disk name (each with the chain it needs)
        and the shards' newest; remove the others. Embedded shards only (their disk is ours)."""
        if self.shards is None or not self._ps_durable:
            return
        keep: list[set[str]] = [set() for _ in range(self.shards.num_shards)]
        for path in checkpoints(self.cfg.train.checkpoint.dir):  # type: ignore[arg-type]
            try:
                names = read_meta(path).get("ps", {}).get("snapshots") or []
            except FileNotFoundError:  # pruned meanwhile
                continue
            except (OSError, ValueError, CheckpointError):  # unreadable: prune nothing
                return
            for i, name in enumerate(names[: len(keep)]):
                keep[i].add(name)
        for i, names in enumerate(keep):
            snapshots.prune(self.shards.data_dir / f"shard-{i}", names)

    def _restart_shards_from(self, ps_meta: dict[str, Any]) -> None:
        """Bring the PS to the snapshots a checkpoint names: restart embedded shards from them,
        or check that external shards were restarted from them."""
        remote, names = self.cfg.store.remote, ps_meta["snapshots"]
        if len(names) != (remote.num_shards if remote.embedded else self.ps.num_shards):  # type: ignore[union-attr]
            raise CheckpointError(f"checkpoint was taken with {len(names)} PS shards, the config "
                                  "has a different number (store.remote)")
        if remote.embedded:
            self._earlier_snapshots = {}  # the run they belong to goes on
            if self.ps is not None:
                self.ps.close()
            if self.shards is not None:
                self.shards.close()
            self.shards = EmbeddedShards(remote.num_shards, self.cfg.tables, remote.data_dir,
                                         auth_key_file=remote.auth_key, restore=names,
                                         max_rows=remote.max_rows)
            self.ps = self.shards.client(remote.timeout_s, remote.heartbeat_s)
            self.model.ec = self.ec = self._ps_collection()
            return
        assert self.ps is not None
        for i, st in enumerate(self.ps.stats()):
            if st.get("last_snapshot") != names[i]:
                raise CheckpointError(
                    f"PS shard {i} at {self.ps.endpoints[i]} holds snapshot "
                    f"{st.get('last_snapshot')!r}; this checkpoint needs {names[i]!r}: restart it "
                    f"with `cosparse ps serve ... --restore {names[i]}`"
                )

    def resume(self, path: str) -> None:
        ps_meta = read_meta(path).get("ps")
        if ps_meta is not None:
            self._restart_shards_from(ps_meta)
        state, dense, tables, _ = load_checkpoint(path)
        self.model.load_state_dict(dense["model"])
        self.dense_opt.load_state_dict(dense["optimizer"])
        torch.set_rng_state(dense["torch_rng"])
        self.bad_records = int(dense.get("bad_records", 0))
        self.ec.load_rows(tables, state.step, rows_on_ps=ps_meta is not None)
        self.state = state
        self.log(f"resumed from {path}: step {state.step}, epoch {state.epoch}")

    # --- training -----------------------------------------------------------------------------
    def _train_step(self, prepared: PreparedBatch) -> float:
        batch = prepared.batch
        self.model.train()
        self.dense_opt.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        supply0 = self.ec.stage_ms["supply"]
        logits = self.model(prepared)
        labels = batch.labels.to(self.device, non_blocking=True)
        loss = F.binary_cross_entropy_with_logits(logits, labels)
        value = float(loss.detach())  # checked before any update is applied
        t1 = time.perf_counter()
        finite = math.isfinite(value)
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
        supply = self.ec.stage_ms["supply"] - supply0
        self._stages = {
            "supply": supply,
            "forward": (t1 - t0) * 1e3 - supply,
            "backward": (t2 - t1) * 1e3,
            "optim": (t3 - t2) * 1e3,
            "prep": prepared.prep_ms,
            "plan": prepared.plan_ms,
        }
        return value

    def run(self, steps: int | None = None, evaluate: bool = True) -> dict[str, Any]:
        """Train up to ``steps`` in all (default ``train.steps``); evaluate at the end unless
        ``evaluate`` is False. Returns the last interval's metrics (and the evaluation)."""
        if self._earlier_snapshots:  # not resumed from them: this run would train on old rows
            raise stale_snapshots_error(self.cfg, self._earlier_snapshots)
        total = steps if steps is not None else self.cfg.train.steps
        cfg = self.cfg
        stats = IntervalStats()
        self._counters_at_log = self.ec.counters()
        self._shrinks_at_log = self.ec.planner.shrinks
        bar = tqdm(
            total=total, initial=self.state.step, disable=not cfg.train.progress, unit="step",
            dynamic_ncols=True, desc=self.bar_desc, position=self.bar_position,
        )
        last: dict[str, Any] = {}
        try:
            while self.state.step < total and self.state.epoch < cfg.train.epochs:
                stream = self.stream_factory(self.state.batch_in_epoch) if self.stream_factory \
                    else BatchStream(
                        self.train_reader, cfg.data.workers, cfg.data.queue_depth,
                        start_batch=self.state.batch_in_epoch, codec=self.codec,
                        link=self.links.worker_trainer,
                    )
                self.stream = stream  # the live data stream (its worker pids: ``stream.pids``)
                self.data_worker_pids.update(stream.pids)
                # never plan past the last step: planning pulls rows (a PS creates the rows it is
                # asked for), so batches planned but never trained would leave extra rows behind,
                # as many as the prefetch thread happened to reach
                steps_left = itertools.islice(stream, total - self.state.step)
                staged = self.ec.staged(steps_left, cfg.supply.horizon)
                self.ec.planner.watch(self.progress, cfg.train.stall_timeout_s)
                prefetch = Prefetcher(staged, lambda prepared: prepared, cfg.supply.lookahead,
                                      cfg.train.stall_timeout_s)
                failure: str | None = None
                try:
                    for prepared in prefetch:
                        last = self._one_step(prepared, prefetch, stats, bar, total) or last
                        if self.state.step >= total:
                            break
                        failure = self.supply.health() if self.supply is not None else None
                        if failure is not None:
                            break
                    else:
                        self.state.epoch += 1
                        self.state.batch_in_epoch = 0
                except (WorkerExited, DeliveryError) as e:
                    if self.supply is None:
                        raise
                    failure = str(e)
                finally:
                    self.ec.planner.cancel()
                    prefetch.close()
                    stream.close()
                    self.ec.planner.reset(self.state.step)
                if failure is not None:
                    if cfg.supply.fallback is None:
                        raise SupplyFailure(f"{failure} (set supply.fallback: ps-direct to go on "
                                            "without the workers' rows)")
                    self._fall_back(failure)
        finally:
            bar.close()
        if stats.steps:
            last = self._log_interval(stats, None)
        scores = self.evaluate() if evaluate else {}
        final = {**last, "step": self.state.step, **scores, "bad_records": self.bad_records}
        final.pop("kind", None)
        self.sink.write({**final, "kind": "final"})
        return final

    def _one_step(self, prepared: PreparedBatch, prefetch: Prefetcher, stats: IntervalStats,
                  bar: tqdm, total: int) -> dict[str, Any] | None:
        """Train one prepared batch, then log, checkpoint and evaluate when due."""
        cfg = self.cfg
        t0 = time.perf_counter()
        wait0 = prefetch.wait_ms
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
        if prepared.batch.delivery is not None:
            self.delivering_pids.add(prepared.batch.delivery.worker_pid)
        self.state.step += 1
        self.state.batch_in_epoch += 1
        self.progress.beat(f"trained step {self.state.step}")
        if self.supply is not None:
            self.supply.on_step(self.state.step)
        stages = dict(self._stages, read=prefetch.wait_ms - wait0)
        stats.add_step(prepared.batch.batch_size, loss, (time.perf_counter() - t0) * 1e3, stages,
                       skipped=skipped)
        bar.update(1)
        last = None
        if self.state.step % cfg.train.log_every == 0 or self.state.step == total:
            last = self._log_interval(stats, bar)
        ck = cfg.train.checkpoint
        if ck.every and self.state.step % ck.every == 0:
            self.save()
        if cfg.train.eval_every and self.state.step % cfg.train.eval_every == 0:
            self.evaluate()
        return last

    def _log_interval(self, stats: IntervalStats, bar: tqdm | None) -> dict[str, Any]:
        rec = {"kind": "train", "step": self.state.step, **stats.summary()}
        rec["bad_records"] = self.bad_records
        rec["skipped_batches"] = self.skipped_batches
        if self.cfg.features.spec and self.stream_factory is None:  # (a shared stream counts)
            rec["features.computed"] = self.features_computed
        for name, n in self.ec.unique_ids.items():
            rec[f"unique_ids.{name}"] = n
        rec.update(self._store_metrics())
        self.sink.write(rec)
        if bar is not None:
            bar.set_postfix(loss=f"{rec['loss']:.4f}", samples_s=f"{rec['samples_per_s']:,.0f}")
            if bar.disable:
                self.log(
                    f"step {rec['step']}: loss {rec['loss']:.4f}, "
                    f"{rec['samples_per_s']:,.0f} samples/s"
                )
        stats.reset()
        return rec

    def _store_metrics(self) -> dict[str, float]:
        """Tier and PS figures since the last log point, from the runtime counters."""
        out: dict[str, float] = {}
        if self.ps is not None:
            c = self.ps.counters
            prev = getattr(self, "_ps_at_log", (0, 0, 0, 0.0))
            out["bytes.trainer_ps.pull"] = c.bytes_pull - prev[0]
            out["bytes.trainer_ps.push"] = c.bytes_push - prev[1]
            out["ps.requests"] = c.requests - prev[2]
            out["ps.wait_ms"] = (c.wait_s - prev[3]) * 1e3
            self._ps_at_log = (c.bytes_pull, c.bytes_push, c.requests, c.wait_s)
            shard_stats = self.ps.stats()  # one small request per shard per log interval
            out["ps.queue_depth_max"] = max(int(st.get("max_queue_depth", 0)) for st in shard_stats)
            out["ps.busy_s"] = sum(float(st.get("busy_s", 0.0)) for st in shard_stats)
        out.update(self._supply_metrics())
        if self.ec.admission:
            out["admission.rejected"] = sum(a.rejected for a in self.ec.admission.values())
        now = self.ec.counters()
        if not now:
            return out
        totals: dict[str, int] = {}
        for name, c in now.items():
            d = c.minus(self._counters_at_log[name])
            for k, v in d.items():
                totals[k] = totals.get(k, 0) + v
            if d["lookups"]:
                out[f"hit_rate.device.{name}"] = d["device_hits"] / d["lookups"]
                out[f"hit_rate.host.{name}"] = d["host_hits"] / d["lookups"]
            out[f"bytes.host_device.{name}"] = d["bytes_host_device"]
            out[f"bytes.device_host.{name}"] = d["bytes_device_host"]
            out[f"evictions.device.{name}"] = d["evictions_device"]
            out[f"evictions.host.{name}"] = d["evictions_host"]
        if totals["lookups"]:
            out["hit_rate.device"] = totals["device_hits"] / totals["lookups"]
            out["hit_rate.host"] = totals["host_hits"] / totals["lookups"]
        out["bytes.host_device"] = totals["bytes_host_device"]
        out["bytes.device_host"] = totals["bytes_device_host"]
        out["evictions.device"] = totals["evictions_device"]
        out["evictions.host"] = totals["evictions_host"]
        misses = totals["lookups"] - totals["device_hits"]
        below = "trainer_ps" if self.ps is not None else "backing"
        for share, key in (("host", "host_hits"), ("delivered", "delivered_hits"),
                           (below, "backing_hits"), ("fresh", "fresh_rows")):
            out[f"miss_share.{share}"] = totals[key] / misses if misses else 0.0
        out["bytes.delivered_device"] = totals["bytes_delivered_device"]
        out["bytes.backing_device"] = totals["bytes_backing_device"]
        out["bytes.host_backing"] = totals["bytes_host_backing"]
        out["lookahead_shrinks"] = self.ec.planner.shrinks - self._shrinks_at_log
        out["ttl_drops"] = totals["ttl_drops"]
        out["hbm_share"] = self.ec.hbm_share() or 0.0
        self._counters_at_log = now
        self._shrinks_at_log = self.ec.planner.shrinks
        return out

    def _supply_metrics(self) -> dict[str, float]:
        """Worker-side links and delivered rows since the last log point."""
        now = {"wire": self.wire_bytes, **self.supply_counters.as_dict()}
        prev = getattr(self, "_supply_at_log", dict.fromkeys(now, 0))
        self._supply_at_log = now
        d = {k: v - prev[k] for k, v in now.items()}
        out: dict[str, float] = {"bytes.worker_trainer": d["wire"]}
        if self.cfg.supply.path == "collaborative":
            out.update({
                "bytes.worker_ps": d["worker_ps_bytes"],
                "wasted_bytes.worker_ps": d["wasted_bytes"],
                "stale_drops": d["stale_drops"],
                "delivered_rows": d["delivered_rows"],
                "delivered_rows_used": d["used_rows"],
                "filter_publishes": d["publishes"],
                "fallbacks": len(self.fallbacks),
            })
        return out

    def _eval_batches(self, stream: BatchStream) -> Iterator[SparseBatch]:
        """The eval stream's batches joined into at least ``data.eval_batch_size`` samples: one
        dedup, one read of the rows (no planning, no pins) and one forward for each."""
        d = self.cfg.data
        want = d.eval_batch_size or max(d.batch_size, 1024)
        group: list[SparseBatch] = []
        for batch in stream:
            group.append(batch)
            if sum(b.batch_size for b in group) >= want:
                yield concat_batches(group)
                group = []
        if group:
            yield concat_batches(group)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """AUC and log loss over the whole eval split (the tables are not modified)."""
        self.model.eval()
        scores, labels = [], []
        with BatchStream(self.eval_reader, self.cfg.data.workers, self.cfg.data.queue_depth) as s:
            for batch in self._eval_batches(s):
                self.progress.beat(f"evaluating at step {self.state.step}")
                logits = self.model(self.ec.prepare(batch))
                scores.append(torch.sigmoid(logits).float().cpu().numpy())
                labels.append(batch.labels.numpy())
        self.model.train()
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

    def close(self) -> None:
        """Flush the metrics and stop the PS shards this trainer started (safe to call twice)."""
        if getattr(self, "sink", None) is not None:
            self.sink.close()
        if getattr(self, "supply", None) is not None:
            self._stop_collaborative()
        if getattr(self, "_shm_dir", None):
            shutil.rmtree(self._shm_dir, ignore_errors=True)
            self._shm_dir = None
        if getattr(self, "ps", None) is not None:
            self.ps.close()
            self.ps = None
        if getattr(self, "shards", None) is not None:
            self.shards.close()
            self.shards = None
        if getattr(self, "_ps_tmp", None):
            shutil.rmtree(self._ps_tmp, ignore_errors=True)
            self._ps_tmp = None
