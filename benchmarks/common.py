"""What the benchmarks share: the workload, and, re-exported from the modules that hold them, the
worker-process protocol (``benchmarks.workers``), process measurement and statistics
(``benchmarks.measure``) and ``machine_info`` (``benchmarks.machine``).

The workload (TorchRec's own DLRM CPU workload, called "the foundation workload" elsewhere):
``Workload.tables`` tables of ``rows`` x ``dim`` fp32, one feature each, sum pooling. IDs follow a
finite Zipf(``alpha``) over [0, rows) by inverse CDF, then a fixed per-table random permutation (the
hot rows are scattered); they are raw int64. Bags are uniform 1..``max_bag``; ``NUM_DENSE`` dense
features ~ N(0, 1); Bernoulli(0.5) labels. The model is a DLRM with the bottom MLP
NUM_DENSE-BOTTOM-dim and the top MLP TOP; row-wise Adagrad (lr, eps) trains the rows and Adagrad (lr)
the dense part. ``make_batches`` generates every batch from ``seed`` before anything is timed.

The worker-process protocol: each contender runs in its own process. ``Worker`` is the parent's
handle on one, ``serve`` the loop in the worker. A worker builds its data and its model once, then
answers one JSON line per command. The parent alternates the contenders round by round
(``rotation``), so noise on a shared machine hits all of them.

Run a benchmark from the repository root as a module: ``.venv/bin/python -m benchmarks.bench_ps``.
At module level this file (and the three it re-exports) imports only the standard library and
numpy (torch, numba and cosparse inside the functions that use them), because
benchmarks/peer_torchrec.py imports it in .venv-peers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.machine import machine_info  # noqa: F401  (every benchmark's, from here)
from benchmarks.measure import (  # noqa: F401  (the benchmarks import them from here)
    HZ,
    REPO,
    busy_s,
    cpu_s,
    engine_fingerprint,
    median,
    median_by_key,
    pct,
    peak_rss_mb,
    proc_cpu_s,
    proc_hwm_mb,
    process_stats,
    rss_mb,
    spread,
    step_ms,
    tree_cpu_s,
)
from benchmarks.workers import (  # noqa: F401
    Handler,
    Worker,
    close_all,
    other_cores,
    rotation,
    serve,
    wait_ready,
    worker_env,
)

SHARED_DATA = REPO.parent / "shared" / "data"
NUM_DENSE = 13
BOTTOM = [512, 256]  # + [dim]
TOP = [512, 256, 1]

Batch = dict[str, np.ndarray]  # values int64 (feature-major), lengths int64 [F*B], dense, labels


# ----------------------------------------------------------------------------------- workload
@dataclasses.dataclass
class Workload:
    """The data and the model sizes. Each benchmark's config extends it with its own knobs."""

    tables: int = 8
    rows: int = 1_000_000
    dim: int = 64
    batch: int = 4096
    alpha: float = 1.05
    max_bag: int = 20
    lr: float = 0.01
    eps: float = 1e-8
    seed: int = 1234

    @property
    def features(self) -> list[str]:
        return [f"f{i}" for i in range(self.tables)]


def make_batches(w: Workload, n: int) -> list[Batch]:
    """``n`` pre-generated raw batches. One generator stream from ``w.seed``, so the first ``k``
    batches are the same whatever ``n``."""
    rng = np.random.default_rng(w.seed)
    p = np.arange(1, w.rows + 1, dtype=np.float64) ** (-w.alpha)
    cdf = np.cumsum(p)
    cdf /= cdf[-1]
    perms = [rng.permutation(w.rows).astype(np.int64) for _ in range(w.tables)]
    out = []
    for _ in range(n):
        lens, ids = [], []
        for f in range(w.tables):
            ln = rng.integers(1, w.max_bag + 1, size=w.batch, dtype=np.int64)
            ranks = np.searchsorted(cdf, rng.random(int(ln.sum())), side="right")
            np.minimum(ranks, w.rows - 1, out=ranks)
            lens.append(ln)
            ids.append(perms[f][ranks])
        out.append({
            "values": np.concatenate(ids),
            "lengths": np.concatenate(lens),
            "dense": rng.standard_normal((w.batch, NUM_DENSE), dtype=np.float32),
            "labels": (rng.random(w.batch) < 0.5).astype(np.float32),
        })
    return out


def data_checksum(raw: list[Batch]) -> str:
    """Cheap fingerprint, so that the parent can check that every worker has the same batches."""
    s = sum(int(b["values"].sum() % (1 << 61)) + int(b["lengths"].sum()) for b in raw)
    return f"{len(raw)}:{s % (1 << 61)}:{float(raw[-1]['dense'].sum()):.6f}"


def ids_per_batch(raw: list[Batch]) -> float:
    return float(np.mean([b["values"].shape[0] for b in raw]))


def save_batches(raw: list[Batch], path: Path) -> None:
    """One file for the workers to load, so that the parent generates the batches once."""
    voff = np.zeros(len(raw) + 1, dtype=np.int64)
    np.cumsum([b["values"].shape[0] for b in raw], out=voff[1:])
    np.savez(path, values=np.concatenate([b["values"] for b in raw]), voff=voff,
             lengths=np.stack([b["lengths"] for b in raw]), dense=np.stack([b["dense"] for b in raw]),
             labels=np.stack([b["labels"] for b in raw]))


def load_batches(path: Path) -> list[Batch]:
    z = np.load(path)
    values, voff = z["values"], z["voff"]
    lengths, dense, labels = z["lengths"], z["dense"], z["labels"]
    return [{"values": values[voff[i]:voff[i + 1]], "lengths": lengths[i], "dense": dense[i],
             "labels": labels[i]} for i in range(voff.shape[0] - 1)]


def sparse_batches(w: Workload, raw: list[Batch]) -> list[Any]:
    """cosparse's input: one ``SparseBatch`` per batch, its offsets already computed (cached), like
    the offsets the other contenders get precomputed."""
    import torch

    from cosparse.batch import SparseBatch

    feats = w.features
    out = []
    for i, b in enumerate(raw):
        sb = SparseBatch(list(feats), torch.from_numpy(b["values"]), torch.from_numpy(b["lengths"]),
                         torch.from_numpy(b["dense"]), torch.from_numpy(b["labels"]), index=i)
        _ = sb.offsets
        out.append(sb)
    return out


def table_configs(w: Workload, vocab: str = "dynamic") -> list[Any]:
    """cosparse's tables: table ``t{i}`` holds feature ``f{i}``, sum pooling, row-wise Adagrad;
    ``vocab: fixed`` takes the IDs (already below ``rows``) as row numbers."""
    from cosparse.config import OptimizerConfig, TableConfig

    return [
        TableConfig(name=f"t{i}", dim=w.dim, features=[f"f{i}"], pooling="sum",
                    optimizer=OptimizerConfig(kind="rowwise_adagrad", lr=w.lr, eps=w.eps),
                    num_embeddings=w.rows, vocab=vocab,
                    hash_size=w.rows if vocab == "fixed" else None)
        for i in range(w.tables)
    ]


def cosparse_dlrm(ec: Any, w: Workload) -> tuple[Any, Any]:
    """cosparse's DLRM (``model.kind: dlrm``) over ``ec`` in train mode, as the trainer drives
    it, and Adagrad over its parameters."""
    import torch

    from cosparse.models import dlrm
    from cosparse.nn.engine_model import EngineModel

    tables = list(ec.configs.values())
    model = EngineModel(dlrm.build(tables, NUM_DENSE, bottom=[*BOTTOM, w.dim], top=list(TOP)))
    model.ec = ec
    model = model.to(ec.device)
    model.train()
    return model, torch.optim.Adagrad(model.parameters(), lr=w.lr)


def train_step(model: Any, opt: Any, ec: Any, p: Any) -> Any:
    """One step as the trainer takes it: forward, BCE, backward, dense step, the rows' optimizer.
    Returns the loss tensor."""
    import torch.nn.functional as F

    opt.zero_grad(set_to_none=True)
    if p.slots is None:  # prepared but not planned (no prefetch thread plans it): plan it here
        ec.stage(p, blocking=False)
    logits = model(p)
    loss = F.binary_cross_entropy_with_logits(logits, p.batch.labels.to(logits.device))
    loss.backward()
    opt.step()
    ec.apply_gradients()
    return loss


def require_device(device: str) -> None:
    """Refuse ``--device cuda`` where torch sees no CUDA device, saying what is missing."""
    import torch

    if device not in ("cpu", "cuda"):
        raise SystemExit(f"--device: {device!r} is not cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device cuda: torch {torch.__version__} (CUDA build: {torch.version.cuda}) "
                         "sees no CUDA device; run on a machine with one (benchmarks/gpu_check.sh) "
                         "or use --device cpu")


def sync(device: Any) -> None:
    """Wait for the device's queued work (CUDA kernels are asynchronous), so a clock read after
    it covers the step; nothing to wait for on the CPU."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def upstream_grads(w: Workload) -> list[Any]:
    """The fixed random upstream gradient of each pooled output (the same in every worker)."""
    import torch

    g = torch.Generator().manual_seed(w.seed + 1)
    return [torch.randn(w.batch, w.dim, generator=g) * 1e-3 for _ in range(w.tables)]


def add_device_arg(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="where the cosparse contenders' device tier and model run (cuda: "
                         "benchmarks/gpu_check.sh)")


def set_threads(threads: int) -> None:
    """torch's intra-op threads (0: torch's default)."""
    import torch

    if threads:
        torch.set_num_threads(threads)


def set_numba_threads(threads: int) -> None:
    """numba's threads (0: numba's default), at most what the process started with."""
    import numba

    if threads:
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))


class GatedSource:
    """Batches for one long-lived ``Prefetcher``, handed out only as far as ``allow`` says.

    Between rounds, while the other contenders are timed, the prefetch thread then does no work,
    and every timed round does the work of steady-state training.
    """

    def __init__(self, batches: list[Any]) -> None:
        self.batches = batches
        self.cond = threading.Condition()
        self.allowed = -1  # batches with index <= allowed may be read
        self.stopped = False

    def __iter__(self) -> Iterator[Any]:
        for i, sb in enumerate(self.batches):
            with self.cond:
                while self.allowed < i and not self.stopped:
                    self.cond.wait(0.1)
                if self.stopped:
                    return
            yield sb

    def allow(self, last: int) -> None:
        with self.cond:
            self.allowed = last
            self.cond.notify_all()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()


# ------------------------------------------------------------------------------ command line
def add_run_args(ap: argparse.ArgumentParser, quick: str, tiny: str, **helps: str) -> None:
    """The options every round-based benchmark has; ``helps`` overrides a help text by dest."""
    h = {"steps": "timed train steps per contender per round",
         "rounds": "alternating timed rounds",
         "warmup": "untimed trained batches per contender before round 0", **helps}
    ap.add_argument("--quick", action="store_true", help=quick)
    ap.add_argument("--tiny", action="store_true", help=tiny)
    ap.add_argument("--steps", type=int, help=h["steps"])
    ap.add_argument("--rounds", type=int, help=h["rounds"])
    ap.add_argument("--warmup", type=int, help=h["warmup"])
    ap.add_argument("--threads", type=int, default=0, help="torch / numba threads (0: default)")
    ap.add_argument("--tables", type=int)
    ap.add_argument("--rows", type=int)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--config-json", help=argparse.SUPPRESS)


def sized(cfg: Any, a: argparse.Namespace, quick: dict[str, Any], tiny: dict[str, Any],
          overrides: Iterable[str]) -> Any:
    """``cfg`` shrunk by --quick (``quick``) or --tiny (``quick``, then ``tiny``), then the options
    named in ``overrides`` that were given."""
    if a.quick or a.tiny:
        cfg = dataclasses.replace(cfg, **quick)
    if a.tiny:
        cfg = dataclasses.replace(cfg, **tiny)
    given = {k: getattr(a, k) for k in overrides if getattr(a, k) is not None}
    return dataclasses.replace(cfg, **given)


def write_json(path: str, out: dict[str, Any]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


def din_model_and_tables(seq_len: int) -> dict[str, Any]:
    """The DIN benchmarks' model and tables (item, category, user; no history pooling), as
    config mappings: softmax attention beyond 100 events."""
    opt = {"kind": "rowwise_adagrad", "lr": 0.1}
    return {
        "model": {"kind": "din", "din": {"pairs": [["target_item", "hist_item"],
                                                   ["target_cate", "hist_cate"]],
                                         "attention": [32, 16], "mlp": [64, 32],
                                         "normalize": "softmax" if seq_len > 100 else "none"},
                  "dense_optimizer": {"kind": "adam", "lr": 0.005}},
        "tables": [
            {"name": "item", "dim": 16, "features": ["target_item", "hist_item"],
             "pooling": "none", "optimizer": dict(opt)},
            {"name": "cate", "dim": 16, "features": ["target_cate", "hist_cate"],
             "pooling": "none", "optimizer": dict(opt)},
            {"name": "user", "dim": 8, "features": ["user"], "optimizer": dict(opt)},
        ],
    }
