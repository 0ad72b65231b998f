"""torch-rechub peer of bench_quality, run by the interpreter of .venv-quality (``make peers``),
which has torch-rechub 0.9.0 and no cosparse: it imports only numpy, torch, scikit-learn and
torch_rechub.

``--family retrieval``: torch-rechub's ``DSSM`` (``benchmarks/peer_rechub_retrieval.py``).

``--family multitask``: torch-rechub's ``MMOE`` on the samples ``benchmarks/quality_multitask.py``
wrote (an .npz of padded arrays: the target item, category and user, the history's items,
categories and behaviours, mean-pooled with padding 0 masked, a history sharing its target's
table; one binary label per task), with the hyperparameters cosparse's run uses: 4 experts of
[64, 32], a [32] tower per task, embedding dim 16 for every table, batch 256, one epoch in the
exported order, Adam at 0.005 (torch-rechub trains its embeddings with the dense optimizer; it
has no row-wise Adagrad), the sum of the tasks' mean BCE. Its MLPs have BatchNorm, as
torch-rechub builds them. Per seed it prints one JSON line: each task's eval AUC
(scikit-learn's ``roc_auc_score``) and the training samples/s (the training loop alone).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

DIM = 16  # every table's: torch-rechub concatenates its embeddings along one dim
SINGLE = {"target_item": "item", "target_cate": "cate", "user": "user"}
SEQUENCE = {"hist_item": "target_item", "hist_cate": "target_cate", "hist_btag": None}
BATCH = 256
LR = 0.005


def features(vocab: dict[str, int]) -> list:
    from torch_rechub.basic.features import SequenceFeature, SparseFeature

    out: list = [SparseFeature(f, vocab[t], DIM) for f, t in SINGLE.items()]
    out += [SequenceFeature("hist_item", vocab["item"], DIM, pooling="mean",
                            shared_with="target_item", padding_idx=0),
            SequenceFeature("hist_cate", vocab["cate"], DIM, pooling="mean",
                            shared_with="target_cate", padding_idx=0),
            SequenceFeature("hist_btag", vocab["btag"], DIM, pooling="mean",
                            padding_idx=0)]
    return out


def mmoe(vocab: dict[str, int], tasks: int) -> torch.nn.Module:
    from torch_rechub.models.multi_task import MMOE

    return MMOE(features(vocab), ["classification"] * tasks, n_expert=4,
                expert_params={"dims": [64, 32]},
                tower_params_list=[{"dims": [32]} for _ in range(tasks)])


def split(data: dict[str, np.ndarray], name: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    keys = [*SINGLE, *SEQUENCE]
    return ({k: torch.from_numpy(data[f"{name}.{k}"]) for k in keys},
            torch.from_numpy(data[f"{name}.labels"]))


def run(data: dict[str, np.ndarray], vocab: dict[str, int], seed: int) -> dict:
    from sklearn.metrics import roc_auc_score

    tasks = [str(t) for t in data["tasks"]]
    x, y = split(data, "train")
    torch.manual_seed(seed)
    model = mmoe(vocab, len(tasks))
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    bce = torch.nn.BCELoss()
    n = y.shape[0]
    model.train()
    t0 = time.perf_counter()
    for lo in range(0, n, BATCH):
        xb = {k: v[lo:lo + BATCH] for k, v in x.items()}
        p = model(xb)  # [B, tasks] probabilities
        loss = sum(bce(p[:, i], y[lo:lo + BATCH, i]) for i in range(len(tasks)))
        opt.zero_grad()
        loss.backward()
        opt.step()
    train_s = time.perf_counter() - t0
    model.eval()
    ex, ey = split(data, "eval")
    with torch.no_grad():
        scores = torch.cat([model({k: v[lo:lo + 4096] for k, v in ex.items()})
                            for lo in range(0, ey.shape[0], 4096)])
    auc = {t: float(roc_auc_score(ey[:, i].numpy(), scores[:, i].numpy()))
           for i, t in enumerate(tasks)}
    return {"seed": seed, "auc": auc, "samples_per_s": n / train_s, "train_s": train_s}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", choices=["multitask", "retrieval"], default="multitask")
    ap.add_argument("--data", required=True,
                    help="the .npz quality_multitask (quality_retrieval) wrote")
    ap.add_argument("--epochs", type=int, default=5, help="retrieval: epochs over the samples")
    ap.add_argument("--vocab", required=True, help="JSON: each table's vocabulary size")
    ap.add_argument("--seeds", default="0", help="comma-separated model seeds")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    with np.load(a.data) as f:
        data = {k: f[k] for k in f.files}
    vocab = json.loads(a.vocab)
    for seed in (int(s) for s in a.seeds.split(",")):
        if a.family == "retrieval":
            from benchmarks import peer_rechub_retrieval

            got = peer_rechub_retrieval.run(data, vocab, seed, a.epochs)
        else:
            got = run(data, vocab, seed)
        print(json.dumps(got), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
