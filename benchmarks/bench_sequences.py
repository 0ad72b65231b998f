"""Long behaviour sequences: DIN training throughput at sequence lengths 100, 1,000 and 10,000,
and SASRec's time and memory per step against history length (``benchmarks/sequences_sasrec.py``:
L = 50 to 10,000, resident and at a 10% device tier). ``--only din|sasrec`` runs one part.

Workloads (DIN: pairs [target_item, hist_item], [target_cate, hist_cate]; item and cate tables
unpooled, dim 16, row-wise Adagrad; user dim 8; hist_btag mean-pooled, dim 4; attention [32, 16],
MLP [64, 32], Adam on dense; label = buy / the synthetic rule):
  L=100     the Taobao UserBehavior sample, max_len 100 (real histories: up to 100, mean ~60).
  L=1000    synthetic sequences (``synthetic_sequences``), every history exactly 1,000 events,
            Zipf(1.05) items over 100k, 1k categories.
  L=10000   the same with histories of 10,000 events.

Contenders, each trained through the real ``Trainer`` (data built in-process, workers 0, 2
threads), after an untimed warm-up:
  resident  every row resident on the device (the reference engine).
  tiered    a bounded device tier of 10% of the rows the run touches, or the least that holds the
            unique rows of 3 consecutive batches when that is more (lookahead 2), host unbounded.
  torch     baseline: the same DIN module over plain ``torch.nn.Embedding(sparse=True)`` tables
            (IDs mapped to dense indices by ``np.searchsorted`` on the run's vocabulary, in the
            loop) and ``torch.optim.Adagrad`` (element-wise) on the sparse gradients; the same
            batches, built in the loop like the trainer does.

Figures: ``samples_per_s`` (wall clock over the timed steps, data build included, as the trainer
reports it) and ``unique_ids_per_s`` (the unique IDs of every table of the timed batches, summed,
per second). Ratios are against ``torch`` of the same workload. ``--quick`` shrinks steps and
batches (< 60 s); ``--json PATH`` writes every figure.
"""

from __future__ import annotations

import argparse
import copy
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks import sequences_sasrec
from benchmarks.common import SHARED_DATA, din_model_and_tables, machine_info, write_json
from cosparse.config import TableConfig, config_from_mapping
from cosparse.data import make_reader
from cosparse.models.builtin import build_model
from cosparse.nn.types import Jagged, PreparedBatch
from cosparse.store.dedup import Deduper
from cosparse.train.trainer import Trainer

TAOBAO = SHARED_DATA / "taobao-userbehavior" / "UserBehavior_head84k.csv"


def din_mapping(seq_len: int, batch: int) -> dict[str, Any]:
    if seq_len == 100:
        data: dict[str, Any] = {"reader": "taobao_events", "path": str(TAOBAO),
                                "events": {"max_len": 100}}
    else:
        data = {"reader": "synthetic_sequences", "events": {"synthetic": {
            "seq_len": seq_len, "vocab_size": 100_000, "num_cates": 1000, "seed": 3}}}
    data.update(batch_size=batch, eval_fraction=0.2)
    din = din_model_and_tables(seq_len)
    din["tables"].append({"name": "btag", "dim": 4, "features": ["hist_btag"], "pooling": "mean",
                          "optimizer": {"kind": "rowwise_adagrad", "lr": 0.1}})
    return {
        "data": data,
        **din,
        "train": {"steps": 1 << 30, "epochs": 1000, "progress": False, "log_every": 1 << 30,
                  "threads": 2, "device": "auto"},
    }


def trace(raw: dict[str, Any], n: int) -> dict[str, Any]:
    """Unique IDs per table of the first ``n`` train batches: per batch, the touched total, the
    most of 3 consecutive batches, and every table's vocabulary (for the torch baseline)."""
    cfg = config_from_mapping(copy.deepcopy(raw))
    reader = make_reader(cfg.data, "train")
    dedup = Deduper()
    per: dict[str, list[np.ndarray]] = {t.name: [] for t in cfg.tables}
    for i, task in enumerate(reader.tasks()):
        if i == n:
            break
        b = reader.build(task)
        for t in cfg.tables:
            ids = np.concatenate([b.feature(f)[0].numpy() for f in t.features])
            per[t.name].append(dedup.unique(ids)[0])
    unique_per_batch = [sum(per[t][i].shape[0] for t in per) for i in range(len(per["item"]))]
    vocab = {t: np.unique(np.concatenate(v)) for t, v in per.items()}
    window = max(max(np.unique(np.concatenate(v[i : i + 3])).shape[0] for i in range(len(v)))
                 for v in per.values())
    return {"unique_per_batch": unique_per_batch, "vocab": vocab, "window": window,
            "touched": max(v.shape[0] for v in vocab.values())}


def run_trainer(raw: dict[str, Any], warm: int, steps: int) -> float:
    t = Trainer(config_from_mapping(copy.deepcopy(raw)), log=lambda m: None)
    try:
        t.run(steps=warm, evaluate=False)
        final = t.run(steps=warm + steps, evaluate=False)
    finally:
        t.close()
    return float(final["samples_per_s"])


class TorchLookup(nn.Module):
    """Plain torch tables with the EmbeddingCollection's interface that DIN uses."""

    def __init__(self, tables: list[TableConfig], vocab: dict[str, np.ndarray],
                 device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.configs = {t.name: t for t in tables}
        self.feature_table = {f: t.name for t in tables for f in t.features}
        self.features = list(self.feature_table)
        self.vocab = vocab
        self.emb = nn.ModuleDict({t.name: nn.Embedding(vocab[t.name].shape[0] + 1, t.dim,
                                                       sparse=True) for t in tables})
        for e in self.emb.values():
            nn.init.uniform_(e.weight, -0.05, 0.05)

    def dim_of(self, feature: str) -> int:
        return self.configs[self.feature_table[feature]].dim

    def forward(self, prepared: PreparedBatch) -> dict[str, torch.Tensor | Jagged]:
        batch = prepared.batch
        out: dict[str, torch.Tensor | Jagged] = {}
        for f in self.features:
            name = self.feature_table[f]
            ids, lengths = batch.feature(f)
            v = self.vocab[name]
            idx = np.minimum(np.searchsorted(v, ids.numpy()), v.shape[0])  # unseen: the spare row
            idx_t = torch.from_numpy(idx).to(self.device)
            offsets = torch.zeros(lengths.shape[0] + 1, dtype=torch.int64)
            torch.cumsum(lengths, 0, out=offsets[1:])
            w = self.emb[name]
            if self.configs[name].pooling == "none":
                out[f] = Jagged(w(idx_t), lengths.to(self.device), offsets.to(self.device))
            else:
                out[f] = F.embedding_bag(idx_t, w.weight, offsets.to(self.device),
                                         mode=self.configs[name].pooling, sparse=True,
                                         include_last_offset=True)
        return out


def run_torch(raw: dict[str, Any], vocab: dict[str, np.ndarray], warm: int, steps: int) -> float:
    cfg = config_from_mapping(copy.deepcopy(raw))
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    lookup = TorchLookup(cfg.tables, vocab, device)
    model = build_model(cfg, 0, device)  # DIN, its lookup then swapped for the torch one
    model.ec = lookup
    sparse_opt = torch.optim.Adagrad(list(lookup.parameters()), lr=0.1)
    dense_params = [p for n, p in model.named_parameters() if not n.startswith("model.embeddings.")]
    dense_opt = torch.optim.Adam(dense_params, lr=0.005)
    reader = make_reader(cfg.data, "train")
    tasks = reader.tasks()
    t0 = 0.0
    samples = 0
    for i in range(warm + steps):
        if i == warm:
            t0 = time.perf_counter()
        b = reader.build(next(tasks))
        logits = model(PreparedBatch(b, {}))
        loss = F.binary_cross_entropy_with_logits(logits, b.labels.to(device))
        sparse_opt.zero_grad(set_to_none=True)
        dense_opt.zero_grad(set_to_none=True)
        loss.backward()
        sparse_opt.step()
        dense_opt.step()
        if i >= warm:
            samples += b.batch_size
    if device.type == "cuda":
        torch.cuda.synchronize()
    return samples / (time.perf_counter() - t0)


def bench_one(seq_len: int, batch: int, warm: int, steps: int) -> dict[str, Any]:
    raw = din_mapping(seq_len, batch)
    tr = trace(raw, warm + steps)
    rows = max(tr["touched"] // 10, tr["window"])
    tiered = copy.deepcopy(raw)
    tiered["store"] = {"device": {"rows": rows, "policy": "hotness"}}
    tiered["supply"] = {"lookahead": 2}
    timed_unique = sum(tr["unique_per_batch"][warm : warm + steps])
    out: dict[str, Any] = {"seq_len": seq_len, "batch_size": batch, "warmup": warm,
                           "steps": steps, "device_rows": rows, "touched_rows": tr["touched"],
                           "unique_ids_per_batch": timed_unique / steps, "contenders": {}}
    for name, fn in (("torch", lambda: run_torch(raw, tr["vocab"], warm, steps)),
                     ("resident", lambda: run_trainer(raw, warm, steps)),
                     ("tiered", lambda: run_trainer(tiered, warm, steps))):
        sps = fn()
        out["contenders"][name] = {"samples_per_s": sps,
                                   "unique_ids_per_s": sps / batch * timed_unique / steps}
    base = out["contenders"]["torch"]["samples_per_s"]
    for c in out["contenders"].values():
        c["ratio_vs_torch"] = c["samples_per_s"] / base
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer steps and smaller batches (< 60 s)")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--only", choices=("din", "sasrec"), default=None, help="run one part")
    a = p.parse_args(argv)
    torch.set_num_threads(2)
    # (seq_len, batch, warm-up, timed steps)
    plan = ([(100, 256, 5, 20), (1000, 32, 2, 8), (10_000, 4, 2, 6)] if a.quick else
            [(100, 256, 20, 200), (1000, 64, 5, 80), (10_000, 16, 3, 40)])
    if not TAOBAO.exists():
        print(f"skipping L=100: {TAOBAO} is not present")
        plan = plan[1:]
    if a.only == "sasrec":
        plan = []
    t0 = time.perf_counter()
    results = [bench_one(*w) for w in plan]
    print(f"\n{'L':>6} {'batch':>5} {'uniq/batch':>10} {'dev rows':>9} {'touched':>9} | "
          f"{'contender':<9} {'samples/s':>10} {'unique IDs/s':>13} {'vs torch':>8}")
    for r in results:
        for name, c in r["contenders"].items():
            print(f"{r['seq_len']:>6} {r['batch_size']:>5} {r['unique_ids_per_batch']:>10,.0f} "
                  f"{r['device_rows']:>9,} {r['touched_rows']:>9,} | {name:<9} {c['samples_per_s']:>10,.1f} "
                  f"{c['unique_ids_per_s']:>13,.0f} {c['ratio_vs_torch']:>7.2f}x")
    out = {"benchmark": "bench_sequences", "mode": "quick" if a.quick else "full",
           "seconds": time.perf_counter() - t0, "torch_threads": torch.get_num_threads(),
           "device": "cuda" if torch.cuda.is_available() else "cpu",
           "machine": {**machine_info(), "torch": torch.__version__},
           "results": results,
           "sasrec": sequences_sasrec.run(a.quick) if a.only != "din" else []}
    out["seconds"] = time.perf_counter() - t0
    print(f"total {out['seconds']:.1f} s")
    if a.json:
        write_json(a.json, out)
    return out


if __name__ == "__main__":
    main()
