"""bench_inmemory's cosparse contenders: the EmbeddingCollection + DLRM as the trainer drives it
(with a prefetch thread, or inline) and the dense-only bound over the same model."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import numpy as np

from benchmarks import common
from benchmarks.inmemory_worker import BenchConfig, Contender


class CosparseContender(Contender):
    """cosparse EmbeddingCollection + DLRM; ``lookahead`` 1 prepares and plans batch t+1 on a
    thread; ``vocab: fixed`` (cosparse_fixed) takes the IDs as row numbers, no ID map."""

    def __init__(self, cfg: BenchConfig, raw: list[common.Batch], lookahead: int,
                 vocab: str = "dynamic") -> None:
        import torch

        from cosparse.nn.embedding import EmbeddingCollection

        common.set_numba_threads(cfg.threads)
        self.name = ("cosparse" if lookahead else "cosparse_inline") + (
            "_fixed" if vocab == "fixed" else "")
        self.cfg, self.lookahead = cfg, lookahead
        torch.manual_seed(cfg.seed)
        self.ec = EmbeddingCollection(common.table_configs(cfg, vocab), device=cfg.device)
        self.model, self.opt = common.cosparse_dlrm(self.ec, cfg)
        self.features = cfg.features
        self.batches = common.sparse_batches(cfg, raw)
        self.grads = [g.to(cfg.device) for g in common.upstream_grads(cfg)]

    def _iter(self, start: int, n: int):
        """(iterator of prepared batches, closer). With lookahead the pipeline is filled first."""
        from cosparse.train.prefetch import Prefetcher

        if not self.lookahead:
            return (self.ec.prepare(self.batches[i]) for i in range(start, start + n)), None
        # one batch past the round so that the last timed step overlaps a prepare, as in steady
        # state; the thread prepares and plans (``ec.staged``), as the trainer's prefetch does
        src = self.batches[start : min(start + n + 1, len(self.batches))]
        pf = Prefetcher(self.ec.staged(src), lambda prepared: prepared, self.lookahead)
        return iter(pf), pf

    def full(self, start: int, n: int) -> list[float]:
        it, pf = self._iter(start, n)
        first = next(it) if pf is not None else None  # fill the pipeline before the clock starts
        times = []
        try:
            last = time.perf_counter()
            for k in range(n):
                p = first if (k == 0 and first is not None) else next(it)
                loss = common.train_step(self.model, self.opt, self.ec, p)
                common.sync(self.ec.device)
                now = time.perf_counter()
                times.append(now - last)
                last = now
            self.last_loss = float(loss.detach())
        finally:
            if pf is not None:
                pf.close()
        return times

    def emb(self, start: int, n: int) -> tuple[list[float], dict[str, float]]:
        """Embedding-only steps; ``ec.prepare`` always runs inline here (it is embedding work)."""
        import torch

        stages: dict[str, float] = defaultdict(float)
        times = []
        for i in range(start, start + n):
            t0 = time.perf_counter()
            p = self.ec.prepare(self.batches[i])
            t1 = time.perf_counter()
            sup0 = self.ec.stage_ms["gather"] + self.ec.stage_ms["fill"]
            self.ec.stage(p, blocking=False)
            out = self.ec(p)
            common.sync(self.ec.device)
            t2 = time.perf_counter()
            torch.autograd.backward([out[f] for f in self.features], self.grads)
            common.sync(self.ec.device)
            t3 = time.perf_counter()
            self.ec.apply_gradients()
            common.sync(self.ec.device)
            t4 = time.perf_counter()
            sup = (self.ec.stage_ms["gather"] + self.ec.stage_ms["fill"] - sup0 + p.plan_ms) / 1e3
            stages["prepare"] += t1 - t0
            stages["supply(slots_for+gather)"] += sup
            stages["pooled_fwd"] += t2 - t1 - sup
            stages["backward"] += t3 - t2
            stages["optimizer"] += t4 - t3
            times.append(t4 - t0)
        return times, {k: 1e3 * v / n for k, v in stages.items()}

    def breakdown(self, start: int, n: int) -> dict[str, float]:
        """Embedding-only steps (prepare inline) with timers wrapped around cosparse internals."""
        import numba
        import torch

        from cosparse.store import dedup, hashmap, resident

        acc: dict[str, float] = defaultdict(float)
        patched: list[tuple[Any, str, Any]] = []

        def wrap(cls: Any, meth: str, label: str) -> None:
            orig = getattr(cls, meth, None)
            if orig is None:
                return

            def timed(*a: Any, **k: Any) -> Any:
                t = time.perf_counter()
                try:
                    return orig(*a, **k)
                finally:
                    acc[label] += time.perf_counter() - t

            setattr(cls, meth, timed)
            patched.append((cls, meth, orig))

        wrap(dedup.Deduper, "_dedup", "prepare.dedup_cpu")
        wrap(dedup.Deduper, "prepare", "_deduper_prepare")
        wrap(hashmap.IdMap, "lookup_or_insert", "supply.vocab_lookup_insert")
        wrap(resident.ResidentTable, "slots_for", "_slots_for")
        wrap(resident.ResidentTable, "gather", "supply.gather")
        wrap(resident.ResidentTable, "apply_gradients", "optimizer.rowwise_adagrad")
        wrap(type(self.ec), "prepare", "_prepare")
        wrap(type(self.ec), "forward", "_ec_forward")
        try:
            for i in range(start, start + n):
                p = self.ec.prepare(self.batches[i])
                self.ec.stage(p, blocking=False)
                out = self.ec(p)
                t = time.perf_counter()
                torch.autograd.backward([out[f] for f in self.features], self.grads)
                acc["backward(transposed embedding_bag)"] += time.perf_counter() - t
                t = time.perf_counter()
                self.ec.apply_gradients()
                acc["_apply"] += time.perf_counter() - t
        finally:
            for cls, meth, orig in reversed(patched):
                setattr(cls, meth, orig)
        ms = {k: 1e3 * v / n for k, v in acc.items()}
        res = {
            # (the tables' ID work runs on the trainer's threads: ``cosparse.store.prep_threads``)
            "prepare": ms.get("_prepare", 0.0),
            "supply.vocab_lookup_insert": ms.get("supply.vocab_lookup_insert", 0.0),
            "supply.init_new_rows": ms.get("_slots_for", 0.0) - ms.get("supply.vocab_lookup_insert", 0.0),
            "supply.gather": ms.get("supply.gather", 0.0),
            # (the plan, slots_for included, runs in ec.stage, before the forward)
            "forward.embedding_bag+other": ms.get("_ec_forward", 0.0) - ms.get("supply.gather", 0.0),
            "backward(transposed embedding_bag)": ms.get("backward(transposed embedding_bag)", 0.0),
            "optimizer.rowwise_adagrad": ms.get("optimizer.rowwise_adagrad", 0.0),
            "optimizer.other": ms.get("_apply", 0.0) - ms.get("optimizer.rowwise_adagrad", 0.0),
        }
        res = {k: round(v, 2) for k, v in res.items()}
        res["total"] = round(sum(res.values()), 2)
        # thread time of the two parts of ``prepare`` (summed over its threads: not in the total)
        res["prepare.dedup_cpu"] = round(ms.get("prepare.dedup_cpu", 0.0), 2)
        res["prepare.transpose_cpu"] = round(ms.get("_deduper_prepare", 0.0)
                                             - ms.get("prepare.dedup_cpu", 0.0), 2)
        res["prepare_threads"] = numba.get_num_threads()
        res["unique_ids_per_table"] = round(float(np.mean(list(self.ec.unique_ids.values()))))
        res["rows_per_table"] = round(float(np.mean([t.num_rows for t in self.ec.tables.values()])))
        return res

    def info(self) -> dict[str, Any]:
        import numba
        import torch

        return {
            "lookahead": self.lookahead,
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "numba_threads": numba.get_num_threads(),
            "numba_threading_layer": _numba_layer(),
            "rows_per_table": int(np.mean([t.num_rows for t in self.ec.tables.values()])),
        }


class DenseBoundContender(Contender):
    """The dense-only bound: cosparse's DLRM (same seed, same dense Adagrad) trained on
    precomputed pooled embeddings, so the embedding cost is zero. Before a round's clock starts,
    the pooled outputs of its batches are read once (``ec`` in eval mode: a read, no training)
    and become constant leaf tensors; each timed step runs the model's dense part
    (``interact``: bottom MLP, interaction, top MLP), BCE, backward (the gradient reaches the
    pooled leaves, as it reaches the embedding outputs end to end) and the dense step."""

    name = "dense_bound"

    def __init__(self, cfg: BenchConfig, raw: list[common.Batch]) -> None:
        import torch

        from cosparse.nn.embedding import EmbeddingCollection

        common.set_numba_threads(cfg.threads)
        self.cfg = cfg
        torch.manual_seed(cfg.seed)
        self.ec = EmbeddingCollection(common.table_configs(cfg), device=cfg.device)
        self.model, self.opt = common.cosparse_dlrm(self.ec, cfg)
        self.ec.eval()  # only reads the rows; the dense towers stay in train mode
        self.features = cfg.features
        self.batches = common.sparse_batches(cfg, raw)

    def _inputs(self, i: int) -> tuple[Any, list[Any], Any]:
        """(dense, pooled leaves, labels) of batch ``i``, computed outside the clock."""
        import torch

        b = self.batches[i]
        with torch.no_grad():
            pooled = self.ec(b)
        embs = [pooled[f].detach().clone().requires_grad_(True) for f in self.features]
        return b.dense.to(self.ec.device), embs, b.labels.to(self.ec.device)

    def full(self, start: int, n: int) -> list[float]:
        import torch.nn.functional as F

        inputs = [self._inputs(i) for i in range(start, start + n)]
        times = []
        last = time.perf_counter()
        for dense, embs, labels in inputs:
            self.opt.zero_grad(set_to_none=True)
            logits = self.model.model.interact(dense, embs).squeeze(-1)  # (the DLRM's head)
            loss = F.binary_cross_entropy_with_logits(logits, labels)
            loss.backward()
            self.opt.step()
            common.sync(self.ec.device)
            now = time.perf_counter()
            times.append(now - last)
            last = now
        self.last_loss = float(loss.detach())
        return times

    def info(self) -> dict[str, Any]:
        import torch

        return {"torch": torch.__version__, "torch_threads": torch.get_num_threads()}


def _numba_layer() -> str:
    try:
        import numba

        return str(numba.threading_layer())
    except Exception:  # noqa: BLE001 - only known after a parallel kernel ran
        return "?"
