"""TorchRec peer worker for bench_inmemory.py, run by the interpreter of .venv-peers (``make peers``).

TorchRec DistributedModelParallel (gloo, world_size 1, CPU) over a DLRM whose EmbeddingBagCollection
the planner shards into FBGEMM CPU TBE (SplitTableBatchedEmbeddingBagsCodegen, EmbeddingLocation.HOST),
with row-wise Adagrad fused into backward (apply_optimizer_in_backward(torchrec RowWiseAdagrad)) and
torch.optim.Adagrad on the dense parameters (KeyedOptimizerWrapper + CombinedOptimizer).

It is bench_inmemory's fourth contender, in a process of its own: it takes the workload from
benchmarks.common and the contender interface and worker loop from benchmarks.inmemory_worker (both
import only numpy at module level; .venv-peers has no cosparse), so the data is bit-identical (the
parent compares checksums). Run standalone from the repository root for a quick check:
``.venv-peers/bin/python -m benchmarks.peer_torchrec --selftest``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections import defaultdict
from typing import Any

from benchmarks.common import BOTTOM, NUM_DENSE, TOP, Batch, make_batches, upstream_grads
from benchmarks.inmemory_worker import BenchConfig, Contender, serve_contender


class TorchRecContender(Contender):
    """TorchRec DMP + FBGEMM TBE with fused row-wise Adagrad."""

    name = "torchrec"

    def __init__(self, cfg: BenchConfig, raw: list[Batch]) -> None:
        import fbgemm_gpu
        import torch
        import torch.distributed as dist
        import torchrec
        from torchrec.datasets.utils import Batch
        from torchrec.distributed import DistributedModelParallel
        from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
        from torchrec.distributed.sharding_plan import get_default_sharders
        from torchrec.models.dlrm import DLRM, DLRMTrain
        from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
        from torchrec.modules.embedding_modules import EmbeddingBagCollection
        from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
        from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
        from torchrec.optim.optimizers import in_backward_optimizer_filter
        from torchrec.optim.rowwise_adagrad import RowWiseAdagrad
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.versions = {"torch": torch.__version__, "fbgemm_gpu": fbgemm_gpu.__version__,
                         "torchrec": getattr(torchrec, "__version__", "?")}
        keys = cfg.features
        tables = [
            EmbeddingBagConfig(name=f"t{i}", embedding_dim=cfg.dim, num_embeddings=cfg.rows,
                               feature_names=[keys[i]], pooling=PoolingType.SUM)
            for i in range(cfg.tables)
        ]
        if not dist.is_initialized():
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(port))
            dist.init_process_group("gloo", rank=0, world_size=1)
        ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
        dlrm = DLRM(embedding_bag_collection=ebc, dense_in_features=NUM_DENSE,
                    dense_arch_layer_sizes=[*BOTTOM, cfg.dim], over_arch_layer_sizes=list(TOP),
                    dense_device=torch.device("cpu"))
        train_model = DLRMTrain(dlrm)
        apply_optimizer_in_backward(RowWiseAdagrad, train_model.model.sparse_arch.parameters(),
                                    {"lr": cfg.lr, "eps": cfg.eps})
        planner = EmbeddingShardingPlanner(
            topology=Topology(world_size=1, local_world_size=1, compute_device="cpu"),
            batch_size=cfg.batch)
        plan = planner.collective_plan(train_model, get_default_sharders(), dist.GroupMember.WORLD)
        self.model = DistributedModelParallel(module=train_model, device=torch.device("cpu"), plan=plan)
        self.plan = {t: [ps.sharding_type, ps.compute_kernel]
                     for mp in plan.plan.values() for t, ps in mp.items()}
        self.tbes = []
        for m in self.model.modules():
            for lk in getattr(m, "_lookups", []) or []:
                for em in getattr(getattr(lk, "module", lk), "_emb_modules", []):
                    tbe = getattr(em, "_emb_module", None)
                    if tbe is not None:
                        self.tbes.append(f"{type(em).__name__}/{type(tbe).__name__} "
                                         f"opt={getattr(tbe, 'optimizer', '?')} "
                                         f"tables={len(getattr(tbe, 'embedding_specs', []))}")
        dense_opt = KeyedOptimizerWrapper(
            dict(in_backward_optimizer_filter(self.model.named_parameters())),
            lambda params: torch.optim.Adagrad(params, lr=cfg.lr))
        self.opt = CombinedOptimizer([self.model.fused_optimizer, dense_opt])
        self.sparse_arch = self.model.module.model.sparse_arch
        self.batches = []
        for b in raw:
            kjt = KeyedJaggedTensor.from_lengths_sync(
                keys=keys, values=torch.from_numpy(b["values"]), lengths=torch.from_numpy(b["lengths"]))
            self.batches.append(Batch(dense_features=torch.from_numpy(b["dense"]), sparse_features=kjt,
                                      labels=torch.from_numpy(b["labels"])))
        self.grad = torch.stack(upstream_grads(cfg), dim=1)  # [B, F, D], SparseArch's output layout

    def full(self, start: int, n: int) -> list[float]:
        times = []
        last = time.perf_counter()
        for i in range(start, start + n):
            self.opt.zero_grad()
            loss, _ = self.model(self.batches[i])
            loss.backward()
            self.opt.step()
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
            t0 = time.perf_counter()
            out = self.sparse_arch(self.batches[i].sparse_features)  # [B, F, D]
            t1 = time.perf_counter()
            torch.autograd.backward(out, self.grad)  # TBE backward + fused row-wise Adagrad
            t2 = time.perf_counter()
            stages["tbe_fwd"] += t1 - t0
            stages["tbe_bwd+fused_rowwise_adagrad"] += t2 - t1
            times.append(t2 - t0)
        return times, {k: 1e3 * v / n for k, v in stages.items()}

    def info(self) -> dict[str, Any]:
        import torch

        from benchmarks.machine import peer_isa

        return {**self.versions, "torch_threads": torch.get_num_threads(), "plan": self.plan,
                "tbe_modules": self.tbes, "isa": peer_isa()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config-json", help="BenchConfig as JSON (worker mode)")
    ap.add_argument("--selftest", action="store_true", help="tiny standalone run, prints a line")
    a = ap.parse_args()
    if a.selftest:
        cfg = BenchConfig(tables=2, rows=10_000, batch=256, warmup=1, steps=3, rounds=1, emb_steps=2,
                          breakdown_steps=0)
        c = TorchRecContender(cfg, make_batches(cfg, cfg.num_batches))
        full = c.full(0, 3)
        emb, stages = c.emb(3, 2)
        print(json.dumps({"full_ms": [round(1e3 * x, 1) for x in full], "emb_stages_ms": stages,
                          "loss": c.last_loss, **c.info()}))
        return 0
    serve_contender(TorchRecContender, BenchConfig(**json.loads(a.config_json)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
