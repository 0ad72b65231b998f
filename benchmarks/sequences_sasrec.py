"""``bench_sequences``' SASRec part: time and memory per training step against history length.

Workload: a synthetic behaviour log (``write_log``) of users whose every target has a history of
exactly L events (Zipf(0.9) items over 10M), read by ``reader: interactions`` from a
``user_items`` file in a temporary folder (removed at the end); ``model.kind: sasrec`` (2 causal
blocks of 2 heads, dim 64, feed-forward 256, in-batch sampled softmax with logQ), its table
unpooled with Adam; each step one batch of B histories of L events, trained through the real
trainer (data built in-process) after an untimed warm-up.

Contenders per L: ``resident`` (every row on the device) and ``tiered`` (a device tier of 10% of
the rows the run touches, or the least that holds the unique rows of 2 consecutive batches when
that is more, lookahead 1; host unbounded; ``device_share`` says which).

Figures per step: ``step_ms_p50`` (the trainer's), ``samples_per_s`` and ``events_per_s`` (B and
B x L over the median step), and memory: ``saved_bytes``, the bytes the forward keeps for the backward (the
activations; unique storages, weights included), measured by autograd's saved-tensor hooks
around the model's forward, its most over the timed steps; and the process's peak RSS after the
contender (``peak_rss_mb``, cumulative over the run: it only grows). On CUDA ``cuda_peak_mb`` is
``torch.cuda.max_memory_allocated`` over the contender.
"""

from __future__ import annotations

import copy
import itertools
import resource
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

import cosparse
from cosparse.config import config_from_mapping
from cosparse.data.synthetic import zipf_tables
from cosparse.models import sasrec
from cosparse.train.inputs import model_inputs

VOCAB = 10_000_000
ALPHA = 0.9  # (a long tail: the run touches ten times the rows of 2 consecutive batches)
DIM = 64


def write_log(path: Path, seq_len: int, users: int, targets: int, seed: int) -> None:
    """``users`` lines of ``seq_len + targets`` Zipf-drawn items (a ``user_items`` file)."""
    rng = np.random.default_rng(seed)
    cdf, _ = zipf_tables(VOCAB, ALPHA)
    n = seq_len + targets
    items = np.minimum(np.searchsorted(cdf, rng.random(users * n), side="right") + 1, VOCAB)
    rows = items.reshape(users, n)
    path.write_text("".join(f"{u + 1} {' '.join(map(str, r))}\n" for u, r in enumerate(rows)))


def mapping(path: Path, seq_len: int, batch: int) -> dict[str, Any]:
    return {
        "data": {"reader": "interactions", "path": str(path), "batch_size": batch,
                 "workers": 0, "split": {"by": "last_per_user"},
                 "events": {"layout": "user_items", "max_len": seq_len,
                            "min_history": seq_len, "shuffle": True, "seed": 0}},
        "objective": {"tasks": {"label": {"kind": "retrieval", "temperature": 1.0}}},
        "model": {"dense_optimizer": {"kind": "adam", "lr": 0.001}},
        "train": {"epochs": 1000, "progress": False, "log_every": 1 << 30, "threads": 2,
                  "device": "auto"},
    }


class SavedBytes:
    """The bytes of the unique storages each forward of a module saves for its backward."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.per_step: list[int] = []
        forward = module.forward

        def measured(*args: Any) -> Any:
            seen: dict[int, int] = {}

            def pack(t: torch.Tensor) -> torch.Tensor:
                s = t.untyped_storage()
                seen[s.data_ptr()] = s.nbytes()
                return t
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = forward(*args)
            self.per_step.append(sum(seen.values()))
            return out
        module.forward = measured  # type: ignore[method-assign]


TABLE = {"name": "ids", "dim": DIM, "pooling": "none", "features": ["user", "item", "hist_item"],
         "optimizer": {"kind": "adam", "lr": 0.001}}


def trace_rows(raw: dict[str, Any], n: int) -> tuple[int, int]:
    """The distinct rows of the first ``n`` train batches, and the most of 2 consecutive."""
    cfg = config_from_mapping({**copy.deepcopy(raw), "model": {"kind": "sasrec"},
                               "tables": [TABLE]})
    reader = model_inputs(cfg).train
    per: list[np.ndarray] = []
    for task in itertools.islice(reader.tasks(), n):
        b = reader.build(task)
        per.append(np.unique(np.concatenate([b.feature(f)[0].numpy()
                                             for f in TABLE["features"]])))
    window = max(np.union1d(a, b).shape[0] for a, b in zip(per, per[1:] or per, strict=False))
    return int(np.unique(np.concatenate(per)).shape[0]), int(window)


def run_contender(raw: dict[str, Any], seq_len: int, warm: int, steps: int) -> dict[str, Any]:
    batch = raw["data"]["batch_size"]
    torch.manual_seed(0)
    model = sasrec.build([TABLE], 0, max_len=seq_len)
    saved = SavedBytes(model)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    with cosparse.Trainer(model, copy.deepcopy(raw), log=lambda m: None) as t:
        t.engine.run(steps=warm, evaluate=False)
        final = t.engine.run(steps=warm + steps, evaluate=False)
    batch = raw["data"]["batch_size"]
    step_s = float(final["step_ms_p50"]) / 1000
    out = {"step_ms_p50": step_s * 1000, "samples_per_s": batch / step_s,
           "events_per_s": batch * seq_len / step_s,
           "saved_bytes": max(saved.per_step[warm:]),
           "saved_bytes_per_event": max(saved.per_step[warm:]) / (batch * seq_len),
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if torch.cuda.is_available():
        out["cuda_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def bench_length(seq_len: int, batch: int, warm: int, steps: int) -> dict[str, Any]:
    """One history length: resident and tiered at a 10% device tier."""
    users = batch * (warm + steps) // 5 + 2
    with tempfile.TemporaryDirectory(prefix="cosparse-bench-sasrec-") as tmp:
        path = Path(tmp) / "log.txt"
        write_log(path, seq_len, users, 6, seed=seq_len)  # (5 train targets a user, 1 eval)
        raw = mapping(path, seq_len, batch)
        touched, window = trace_rows(raw, warm + steps)
        rows = max(touched // 10, window)
        tiered = copy.deepcopy(raw)
        tiered["store"] = {"device": {"rows": rows, "policy": "hotness"}}
        tiered["supply"] = {"lookahead": 1}
        out: dict[str, Any] = {"seq_len": seq_len, "batch_size": batch, "warmup": warm,
                               "steps": steps, "touched_rows": touched, "device_rows": rows,
                               "device_share": rows / touched, "contenders": {}}
        for name, cfg in (("resident", raw), ("tiered", tiered)):
            out["contenders"][name] = run_contender(cfg, seq_len, warm, steps)
    return out


def run(quick: bool) -> list[dict[str, Any]]:
    """Every length of the plan: (L, batch, warm-up, timed steps)."""
    plan = ([(50, 64, 1, 4), (1000, 8, 1, 4)] if quick else
            [(50, 256, 3, 30), (200, 128, 3, 30), (1000, 16, 3, 120), (2000, 8, 3, 30),
             (10_000, 2, 2, 20)])
    results = [bench_length(*p) for p in plan]
    print(f"\nSASRec  {'L':>6} {'batch':>5} {'dev share':>9} | {'contender':<9} "
          f"{'step ms':>8} {'events/s':>10} {'saved MB':>9} {'B/event':>8}")
    for r in results:
        for name, c in r["contenders"].items():
            print(f"        {r['seq_len']:>6} {r['batch_size']:>5} {r['device_share']:>9.1%} | "
                  f"{name:<9} {c['step_ms_p50']:>8.1f} {c['events_per_s']:>10,.0f} "
                  f"{c['saved_bytes'] / 2**20:>9.1f} {c['saved_bytes_per_event']:>8,.0f}")
    return results
