"""The trainer's checkpoints: save (atomically, with the PS snapshots it names), resume from any
layout and world size, the PS restored to a checkpoint's snapshots, and the best evaluation's
checkpoint (``train.keep_best``).

A role of ``cosparse.train.trainer.Trainer`` (its state: ``cfg``, ``path``, ``ec``, ``model``,
``dense_opt``, ``state``, ``ranks``); kept apart so that one step still reads top to bottom there.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from cosparse.parallel.engine import share_ps
from cosparse.supply.types import SnapshotMismatch
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
from cosparse.train.sharded_checkpoint import (
    load_sharded_dense,
    load_sharded_rows,
    my_shards,
    save_sharded,
)


class CheckpointRole:
    """Checkpoint save and resume for ``Trainer``."""

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
            roots = {str(r) for r in (ck.dir, self._best_root(), into) if r}  # (into: this save)
            metas = [ps_metas(r) for r in roots if Path(r).is_dir()]
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

    def _save_best(self) -> None:
        """The best evaluation's checkpoint (one kept) and what early stopping knew then."""
        root = self._best_root()
        assert root is not None and self.early is not None
        self.save(str(root), keep=1)
        if self.ranks is None or self.ranks.world.leader:
            tmp = root / f".{BEST_STATE}.tmp"
            tmp.write_text(json.dumps(self.early.state(), sort_keys=True))
            os.replace(tmp, root / BEST_STATE)


def _history_at(ps_meta: dict[str, Any] | None, step: int) -> list[dict[str, Any]]:
    """The PS snapshot history a resumed run goes on from: the saves up to its step (later
    ones were another branch's)."""
    return [h for h in (ps_meta or {}).get("history", []) if int(h["step"]) <= step]
