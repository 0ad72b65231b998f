"""The retrieval family of the torch-rechub peer (``benchmarks/peer_rechub.py --family
retrieval``), run by .venv-quality's interpreter, without cosparse: torch-rechub 0.9.0's
``DSSM`` (its user tower over the user ID and the mean-pooled history, its item tower over the
item ID, both MLPs of [128, 64] with BatchNorm as torch-rechub builds them, L2-normalised) on
the samples ``benchmarks/quality_retrieval.py`` wrote, trained with cosparse's loss: the in-batch
softmax at temperature 0.2 with the logQ correction (here from exact counts of the stream so
far), a batch's other samples of the same item left out, Adam at 0.002 on everything, batches
of 512, ``--epochs`` epochs (the config's) in the exported order. Evaluated as cosparse
evaluates: the whole corpus ranked for each eval user, the user's earlier items left out, ties
broken by corpus order.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

DIM, TOWER, TEMPERATURE, LR, BATCH, EPOCHS, K = 64, [128, 64], 0.2, 0.002, 512, 5, 10


def dssm(vocab: dict[str, int]) -> torch.nn.Module:
    from torch_rechub.basic.features import SequenceFeature, SparseFeature
    from torch_rechub.models.matching import DSSM

    user = [SparseFeature("user", vocab["user"], DIM),
            SequenceFeature("hist_item", vocab["item"], DIM, pooling="mean",
                            shared_with="item", padding_idx=0)]
    item = [SparseFeature("item", vocab["item"], DIM)]
    return DSSM(user, item, user_params={"dims": TOWER}, item_params={"dims": TOWER})


def ranks(users: np.ndarray, items: np.ndarray, targets: np.ndarray, seen: np.ndarray,
          counts: np.ndarray) -> np.ndarray:
    """Each user's target rank over ``items``, its seen items left out, ties by index."""
    scores = users.astype(np.float32) @ items.astype(np.float32).T
    rows = np.arange(len(targets))
    own = scores[rows, targets].copy()
    scores[np.repeat(rows, counts), seen] = -np.inf
    scores[rows, targets] = own
    cols = np.arange(scores.shape[1])
    return ((scores > own[:, None]).sum(1)
            + ((scores == own[:, None]) & (cols[None, :] < targets[:, None])).sum(1))


def metrics(r: np.ndarray) -> dict[str, float]:
    hit = r < K
    return {"recall@10": float(hit.mean()), "ndcg@10": float((hit / np.log2(r + 2.0)).mean()),
            "mrr": float((1.0 / (r + 1.0)).mean())}


def run(data: dict[str, np.ndarray], vocab: dict[str, int], seed: int, epochs: int = EPOCHS
        ) -> dict:
    torch.manual_seed(seed)
    model = dssm(vocab)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    x = {k: torch.from_numpy(data[f"train.{k}"]) for k in ("user", "item", "hist_item")}
    n = x["user"].shape[0]
    counts = torch.zeros(vocab["item"], dtype=torch.int64)
    seen_total = 0
    model.train()
    t0 = time.perf_counter()
    for _ in range(epochs):
        for lo in range(0, n, BATCH):
            xb = {k: v[lo:lo + BATCH] for k, v in x.items()}
            ids = xb["item"]
            counts.index_add_(0, ids, torch.ones_like(ids))
            seen_total += ids.shape[0]
            log_q = (counts[ids].double() / seen_total).log().float()
            u, v = model.user_tower(xb), model.item_tower(xb)
            logits = u @ v.T / TEMPERATURE - log_q[None, :]
            same = ids[:, None] == ids[None, :]
            same.fill_diagonal_(False)
            loss = F.cross_entropy(logits.masked_fill(same, float("-inf")),
                                   torch.arange(ids.shape[0]), reduction="sum") / ids.shape[0]
            opt.zero_grad()
            loss.backward()
            opt.step()
    train_s = time.perf_counter() - t0
    model.eval()
    with torch.no_grad():
        users = model.user_tower({k: torch.from_numpy(data[f"eval.{k}"])
                                  for k in ("user", "hist_item")}).numpy()
        items = model.item_tower({"item": torch.from_numpy(data["corpus"])}).numpy()
    r = ranks(users, items, data["eval.target"], data["eval.seen"], data["eval.seen_counts"])
    return {"seed": seed, **metrics(r), "samples_per_s": epochs * n / train_s,
            "train_s": train_s}
