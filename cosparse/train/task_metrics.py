"""Per-task evaluation of an objective of several tasks: ``auc.<task>`` and ``logloss.<task>``
of a binary task (and ``gauc.<task>`` with ``group_by``: the AUC per group of a feature's first
ID, weighted by the groups' samples), ``mse.<task>`` and ``mae.<task>`` of a regression. A
masked task is scored on the samples its mask keeps (the mask task's label 1), as it is
trained. The metrics are unweighted unless ``train.weighted_metrics`` (then log loss, MSE and
MAE weigh each sample by ``data.columns.weight``; AUC and GAUC stay unweighted)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from cosparse.config.objective import ObjectiveConfig
from cosparse.data import BatchStream
from cosparse.train.evaluate import joined_batches, roc_auc
from cosparse.train.inputs import WORKER_PRELOAD
from cosparse.train.objective import task_labels, task_predictions


def task_scores(objective: ObjectiveConfig, outputs: dict[str, np.ndarray],
                labels: dict[str, np.ndarray], weights: np.ndarray | None,
                weighted: bool = False, groups: dict[str, np.ndarray] | None = None
                ) -> dict[str, float]:
    """Each task's metrics from its outputs (logits of a binary task) and labels [N];
    ``groups``: per ``group_by`` feature, each sample's group (its first ID)."""
    out: dict[str, float] = {}
    for name, task in objective.tasks.items():
        x = outputs[name].astype(np.float64)
        y = labels[name].astype(np.float64)
        w = weights.astype(np.float64) if weighted and weights is not None else None
        g = None if task.group_by is None or groups is None else groups[task.group_by]
        if task.mask is not None:
            keep = labels[task.mask] > 0.5
            x, y, w = x[keep], y[keep], None if w is None else w[keep]
            g = None if g is None else g[keep]
        if task.kind == "binary":
            p = np.clip(1.0 / (1.0 + np.exp(-x)), 1e-7, 1 - 1e-7)
            out[f"auc.{name}"] = roc_auc(y, p)
            if g is not None:
                out[f"gauc.{name}"] = grouped_auc(y, x, g)
            out[f"logloss.{name}"] = _mean(-(y * np.log(p) + (1 - y) * np.log(1 - p)), w)
        else:
            out[f"mse.{name}"] = _mean((x - y) ** 2, w)
            out[f"mae.{name}"] = _mean(np.abs(x - y), w)
    return out


def grouped_auc(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray) -> float:
    """GAUC: each group's AUC (ties at the average rank), weighted by the group's samples, over
    the groups that hold both classes; NaN when none does, or a score is NaN."""
    n = labels.shape[0]
    if not n or np.isnan(scores).any():
        return float("nan")
    order = np.lexsort((scores, groups))
    g, s, y = groups[order], scores[order], (labels[order] > 0.5).astype(np.float64)
    idx = np.arange(n)
    new_group = np.r_[True, g[1:] != g[:-1]]
    new_block = new_group | np.r_[True, s[1:] != s[:-1]]  # (a block: one group, one score)
    starts = idx[new_block]
    ends = np.r_[starts[1:], n]
    rank = ((starts + ends + 1) / 2.0)[np.cumsum(new_block) - 1]  # 1-based, whole array
    gid = np.cumsum(new_group) - 1
    rank -= idx[new_group][gid]  # 1-based within the group
    count = np.bincount(gid).astype(np.float64)
    pos = np.bincount(gid, weights=y)
    neg = count - pos
    ok = (pos > 0) & (neg > 0)
    if not ok.any():
        return float("nan")
    ranked = np.bincount(gid, weights=rank * y)[ok]
    aucs = (ranked - pos[ok] * (pos[ok] + 1) / 2.0) / (pos[ok] * neg[ok])
    return float((aucs * count[ok]).sum() / count[ok].sum())


def first_ids(ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Each sample's first ID of a feature (a bag of none: the smallest int64)."""
    starts = np.r_[0, np.cumsum(lengths)[:-1]].astype(np.int64)
    out = np.full(lengths.shape[0], np.iinfo(np.int64).min, np.int64)
    has = lengths > 0
    out[has] = ids[starts[has]]
    return out


def _mean(v: np.ndarray, w: np.ndarray | None) -> float:
    if not v.shape[0] or (w is not None and not w.sum()):
        return float("nan")
    return float(v.mean() if w is None else (v * w).sum() / w.sum())


def evaluate_tasks(trainer: Any) -> dict[str, Any]:
    """The eval split's per-task metrics of ``trainer`` (the internal ``Trainer``; its model
    returns each task's outputs), over every rank's samples; written as an eval record."""
    model, cfg = trainer.model, trainer.cfg
    model.eval()
    outs: list[dict[str, np.ndarray]] = []
    ys: list[dict[str, np.ndarray]] = []
    ws: list[np.ndarray] = []
    gs: list[dict[str, np.ndarray]] = []
    group_by = sorted({t.group_by for t in trainer.objective.tasks.values() if t.group_by})
    with torch.no_grad(), BatchStream(trainer.eval_reader, cfg.data.workers,
                                      cfg.data.queue_depth, preload=WORKER_PRELOAD) as s:
        want = cfg.data.eval_batch_size or max(cfg.data.batch_size, 1024)
        for batch in trainer._mine(joined_batches(s, want)):
            trainer.progress.beat(f"evaluating at step {trainer.state.step}")
            got = model(trainer.ec.prepare(batch))
            if not isinstance(got, dict):  # (a built-in model: its one task, label)
                got = {"label": got}
            outs.append({k: v.float().cpu().numpy() for k, v in got.items()})
            ys.append({k: v.numpy() for k, v in task_labels(batch).items()})
            if batch.weights is not None:
                ws.append(batch.weights.numpy())
            gs.append({f: first_ids(*(a.numpy() for a in batch.feature(f))) for f in group_by})
    model.train()
    mine = (outs, ys, ws, gs)
    if trainer.ranks:  # every rank scored its samples: all of them, in global order
        everyone: list[Any] = [None] * trainer.ranks.world.size
        torch.distributed.all_gather_object(everyone, mine)
        outs = [o for e in everyone for o in e[0]]
        ys = [y for e in everyone for y in e[1]]
        ws = [w for e in everyone for w in e[2]]
        gs = [g for e in everyone for g in e[3]]
    if not outs:
        return {}
    tasks = list(trainer.objective.tasks)
    joined_out = {t: np.concatenate([o[t] for o in outs]) for t in tasks}
    joined_y = {t: np.concatenate([y[t] for y in ys]) for t in tasks}
    weights = np.concatenate(ws) if ws else None
    groups = {f: np.concatenate([g[f] for g in gs]) for f in group_by}
    trainer.eval_predictions = {  # (per task, in eval order: what serving reproduces)
        t: np.concatenate([task_predictions(trainer.objective, {k: torch.from_numpy(v)
                                                                for k, v in o.items()})[t]
                           .numpy() for o in outs]) for t in tasks}
    out: dict[str, Any] = task_scores(trainer.objective, joined_out, joined_y, weights,
                                      cfg.train.weighted_metrics, groups)
    out["eval_samples"] = int(joined_y[tasks[0]].shape[0])
    trainer.sink.write({"kind": "eval", "step": trainer.state.step, **out})
    said = ", ".join(f"{k} {v:.4f}" for k, v in out.items() if k != "eval_samples")
    trainer.log(f"eval @ step {trainer.state.step}: {said} ({out['eval_samples']} samples)")
    return out
