"""bench_inmemory's plain-torch contender: nn.EmbeddingBag with sparse gradients and a
hand-written exact row-wise Adagrad (FBGEMM's EXACT_ROWWISE_ADAGRAD math)."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import numpy as np

from benchmarks import common
from benchmarks.inmemory_worker import BenchConfig, Contender


def feature_offsets(lengths: np.ndarray, tables: int, batch: int) -> list[np.ndarray]:
    """Per-feature bag offsets (exclusive prefix sums) into that feature's IDs."""
    out = []
    for f in range(tables):
        ln = lengths[f * batch : (f + 1) * batch]
        off = np.zeros(batch, dtype=np.int64)
        np.cumsum(ln[:-1], out=off[1:])
        out.append(off)
    return out


class SparseRowwiseAdagrad:
    """Exact row-wise Adagrad on sparse COO grads (FBGEMM EXACT_ROWWISE_ADAGRAD math)."""

    def __init__(self, params: list[Any], lr: float, eps: float) -> None:
        import torch

        self.params = list(params)
        self.lr, self.eps = lr, eps
        self.state = [torch.zeros(p.shape[0], dtype=torch.float32) for p in self.params]
        self.coalesce_s = 0.0

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        import torch

        with torch.no_grad():
            for p, s in zip(self.params, self.state, strict=True):
                t = time.perf_counter()
                g = p.grad.coalesce()
                self.coalesce_s += time.perf_counter() - t
                idx = g.indices()[0]
                v = g.values()
                s.index_add_(0, idx, v.pow(2).mean(dim=1))
                mult = self.lr / (s.index_select(0, idx).sqrt_().add_(self.eps))
                p.index_add_(0, idx, v * (-mult).unsqueeze(1))


def torch_mlp(sizes: list[int], last_act: bool) -> Any:
    from torch import nn

    layers: list[Any] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if last_act or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class TorchContender(Contender):
    """Plain torch: nn.EmbeddingBag(sparse=True) per table + hand-written sparse row-wise Adagrad."""

    name = "torch"

    def __init__(self, cfg: BenchConfig, raw: list[dict[str, np.ndarray]]) -> None:
        import torch
        from torch import nn

        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        nf, d = cfg.tables, cfg.dim
        self.embs = nn.ModuleList(
            [nn.EmbeddingBag(cfg.rows, d, mode="sum", sparse=True) for _ in range(nf)]
        )
        bound = (1.0 / cfg.rows) ** 0.5  # torchrec EBC init range
        for e in self.embs:
            nn.init.uniform_(e.weight, -bound, bound)
        self.bottom = torch_mlp([common.NUM_DENSE, *common.BOTTOM, d], last_act=True)
        self.tri = torch.triu_indices(nf + 1, nf + 1, offset=1)
        self.top = torch_mlp([d + (nf + 1) * nf // 2, *common.TOP], last_act=False)
        dense_params = list(self.bottom.parameters()) + list(self.top.parameters())
        self.sopt = SparseRowwiseAdagrad([e.weight for e in self.embs], lr=cfg.lr, eps=cfg.eps)
        self.dopt = torch.optim.Adagrad(dense_params, lr=cfg.lr)
        self.batches = []
        for b in raw:
            offs = feature_offsets(b["lengths"], nf, cfg.batch)
            sp, lo = [], 0
            for f in range(nf):
                n = int(b["lengths"][f * cfg.batch : (f + 1) * cfg.batch].sum())
                sp.append((torch.from_numpy(b["values"][lo : lo + n]), torch.from_numpy(offs[f])))
                lo += n
            self.batches.append((torch.from_numpy(b["dense"]), sp, torch.from_numpy(b["labels"])))
        self.grads = common.upstream_grads(cfg)

    def _pooled(self, sp: list[tuple[Any, Any]]) -> list[Any]:
        return [e(ids, offs) for e, (ids, offs) in zip(self.embs, sp, strict=True)]

    def forward(self, dense: Any, sp: list[tuple[Any, Any]]) -> Any:
        import torch

        x = self.bottom(dense)
        t = torch.stack([x, *self._pooled(sp)], dim=1)
        z = torch.bmm(t, t.transpose(1, 2))
        return self.top(torch.cat([x, z[:, self.tri[0], self.tri[1]]], dim=1)).squeeze(-1)

    def full(self, start: int, n: int) -> list[float]:
        import torch.nn.functional as F

        times = []
        last = time.perf_counter()
        for i in range(start, start + n):
            dense, sp, labels = self.batches[i]
            self.sopt.zero_grad()
            self.dopt.zero_grad(set_to_none=True)
            loss = F.binary_cross_entropy_with_logits(self.forward(dense, sp), labels)
            loss.backward()
            self.sopt.step()
            self.dopt.step()
            now = time.perf_counter()
            times.append(now - last)
            last = now
        self.last_loss = float(loss.detach())
        return times

    def emb(self, start: int, n: int) -> tuple[list[float], dict[str, float]]:
        import torch

        stages: dict[str, float] = defaultdict(float)
        times = []
        for i in range(start, start + n):
            _, sp, _ = self.batches[i]
            self.sopt.zero_grad()
            c0 = self.sopt.coalesce_s
            t0 = time.perf_counter()
            pooled = self._pooled(sp)
            t1 = time.perf_counter()
            torch.autograd.backward(pooled, self.grads)
            t2 = time.perf_counter()
            self.sopt.step()
            t3 = time.perf_counter()
            co = self.sopt.coalesce_s - c0
            stages["embedding_bag_fwd"] += t1 - t0
            stages["backward(sparse grad)"] += t2 - t1
            stages["optimizer.coalesce"] += co
            stages["optimizer.update"] += t3 - t2 - co
            times.append(t3 - t0)
        return times, {k: 1e3 * v / n for k, v in stages.items()}

    def info(self) -> dict[str, Any]:
        import torch

        return {"torch": torch.__version__, "torch_threads": torch.get_num_threads()}
