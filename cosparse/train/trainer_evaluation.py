"""The trainer's evaluation: AUC and log loss over the eval split (per task for an objective of
several tasks: ``cosparse.train.task_metrics``) (or a stream's progressive
window), once per step however many ask, and early stopping's judgement of it.

A role of ``cosparse.train.trainer.Trainer``, kept apart from its step loop.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from cosparse.data import BatchStream
from cosparse.train.evaluate import joined_batches, log_loss, roc_auc
from cosparse.train.inputs import (
    WORKER_PRELOAD,
)
from cosparse.train.objective import task_predictions
from cosparse.train.retrieval_eval import evaluate_retrieval
from cosparse.train.task_metrics import evaluate_tasks


class EvaluationRole:
    """Evaluation and early stopping for ``Trainer``."""

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

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """AUC and log loss over the whole eval split (the tables are not modified); of a
        stream, over its progressive-validation window (``cosparse.train.progressive``)."""
        if self.progressive is not None:
            return self._progressive_scores()
        retrieval = [n for n, t in self.objective.tasks.items() if t.kind == "retrieval"]
        if retrieval:
            return self._retrieval_scores()
        if not self.objective.default:  # per task: auc.<task>, mse.<task>, ...
            return evaluate_tasks(self)
        self.model.eval()
        scores, labels = [], []
        with BatchStream(self.eval_reader, self.cfg.data.workers, self.cfg.data.queue_depth,
                         preload=WORKER_PRELOAD) as s:
            want = self.cfg.data.eval_batch_size or max(self.cfg.data.batch_size, 1024)
            for batch in self._mine(joined_batches(s, want)):
                self.progress.beat(f"evaluating at step {self.state.step}")
                logits = self.model(self.ec.prepare(batch))
                scores.append(task_predictions(self.objective, logits)["label"].cpu().numpy())
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
        self.eval_predictions = {"label": p}  # (in eval order: what serving reproduces)
        out = {"auc": roc_auc(y, p), "logloss": log_loss(y, p), "eval_samples": int(y.shape[0])}
        self.sink.write({"kind": "eval", "step": self.state.step, **out})
        self.log(
            f"eval @ step {self.state.step}: auc {out['auc']:.4f}, logloss {out['logloss']:.4f} "
            f"({out['eval_samples']} samples)"
        )
        return out

    def _retrieval_scores(self) -> dict[str, Any]:
        """The retrieval task's ranking of the whole item corpus, the baselines' beside it."""
        out = evaluate_retrieval(self)
        self.sink.write({"kind": "eval", "step": self.state.step, **out})
        sampled = "".join(f"; against {k[17:]} sampled items: recall@10 {v:.4f}"
                          for k, v in out.items()
                          if k.startswith("recall@10.sampled"))
        self.log(f"eval @ step {self.state.step}: recall@10 {out['recall@10']:.4f}, ndcg@10 "
                 f"{out['ndcg@10']:.4f}, mrr {out['mrr']:.4f} (popularity: recall@10 "
                 f"{out['recall@10.popularity']:.4f}, transitions: "
                 f"{out['recall@10.transitions']:.4f}) over {out['corpus_items']} items "
                 f"({out['eval_samples']} samples{sampled})")
        return out

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
