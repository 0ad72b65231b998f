"""A quality peer for the SASRec comparison: RecBole's own ``SASRec`` trained and evaluated
by RecBole on the S3-Rec preprocessed Amazon Beauty (``Beauty.txt``: one user a line, ``user
item1 ... itemN`` in time order), run by .venv-quality's interpreter, without cosparse.

What it measures: recall@10 (= HR@10 with one target), ndcg@10 and mrr@10 (RecBole has no
untruncated MRR) of each user's LAST item, ranked against every item in the corpus (RecBole's
``mode: full``), after ``--epochs`` epochs of training with no early stopping and no validation
split (``eval_args.split = {'LS': 'test_only'}``), evaluated once with the final weights; and
the training throughput (samples/s over the training epochs alone: no data loading, no eval).

Why it is written this way:

* The file is converted, not filtered, into RecBole atomic files in a temporary directory
  (``user_id:token item_id:token timestamp:float``, the timestamp being the position in the
  user's sequence), with RecBole's interval filters open (``[0,inf)``) and no de-duplication, so
  every user and item is kept. Training samples are RecBole's sequential augmentation: every
  training item with an earlier one is the target of the prefix (its last ``--max-len`` items)
  before it; the loss is the full softmax over the corpus (``loss_type: CE``).
* RecBole's full-sort evaluation of *sequential* models masks only the padding item, not the
  user's earlier items (``FullSortEvalDataLoader`` hands ``history_index=None`` to the trainer
  for them). The S3-Rec/ICLRec line of work, whose figures this peer is compared with, and
  cosparse's evaluation both leave the user's earlier items out, so the headline metrics here do
  the same: each test user's earlier items (all of them, not only the last ``--max-len``) are set
  to -inf before ranking, the target never (Beauty has no repeated items, so it never is one).
  RecBole's stock, unmasked figures are reported too, under ``"recbole_default_unmasked"``.
* ``quick_start`` is not used (it imports ``ray``); this is its ``run_recbole`` path by hand
  (``init_seed``, ``create_dataset``, ``data_preparation``, ``SASRec``, ``Trainer``), with the
  epochs driven here so that only they are timed, and ``evaluate(load_best_model=False)`` so no
  checkpoint is written or read back (which also sidesteps ``torch.load``'s ``weights_only``).
* RecBole 1.2.1 predates numpy 2: ``Config`` aliases ``np.float = np.float_`` and its metrics
  use ``np.float``; ``numpy2_shims`` restores the three removed names it reads (``float_``,
  ``complex_``, ``unicode_``) before ``Config`` is built.
* Importing RecBole's sequential models imports ``sine.py``, which switches autograd's anomaly
  detection on process-wide; it is switched off again (it costs about a third of the step time
  and changes no result). Besides this and the history mask, nothing in RecBole is patched.
* RecBole writes ``./log_tensorboard``, ``./saved`` and ``./log`` relative to the working
  directory, so the run happens with the temporary directory as the working directory (the
  JSON path is resolved first); its logging is left unconfigured (quiet) and no progress bars
  are shown.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

DATASET = "beauty_s3rec"
K = 10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="S3-Rec Beauty.txt")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="where to write the result")
    p.add_argument("--max-len", type=int, default=50, help="MAX_ITEM_LIST_LENGTH")
    p.add_argument("--dim", type=int, default=64, help="hidden_size")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--inner", type=int, default=256, help="inner_size")
    p.add_argument("--dropout", type=float, default=0.5, help="hidden_dropout_prob")
    p.add_argument("--attn-dropout", type=float, default=0.5, help="attn_dropout_prob")
    p.add_argument("--lr", type=float, default=0.001, help="Adam learning rate")
    p.add_argument("--batch", type=int, default=256, help="train_batch_size")
    p.add_argument("--eval-batch", type=int, default=4096, help="eval_batch_size")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    return p.parse_args(argv)


def read_sequences(path: Path) -> dict[str, list[str]]:
    """User token -> its items in time order, as the file has them."""
    seqs: dict[str, list[str]] = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if parts:
                seqs[parts[0]] = parts[1:]
    return seqs


def write_atomic(seqs: dict[str, list[str]], root: Path) -> Path:
    """``<root>/<DATASET>/<DATASET>.inter``; the timestamp is the position in the sequence."""
    d = root / DATASET
    d.mkdir(parents=True)
    with open(d / f"{DATASET}.inter", "w") as f:
        f.write("user_id:token\titem_id:token\ttimestamp:float\n")
        for user, items in seqs.items():
            f.writelines(f"{user}\t{item}\t{t}\n" for t, item in enumerate(items))
    return d


def recbole_config(args: argparse.Namespace, root: Path) -> dict:
    return {
        "data_path": str(root), "checkpoint_dir": str(root / "saved"),
        "use_gpu": False, "gpu_id": "", "worker": 0, "seed": args.seed,
        "reproducibility": True, "state": "WARNING", "show_progress": False,
        "save_dataset": False, "save_dataloaders": False, "log_wandb": False,
        "load_col": {"inter": ["user_id", "item_id", "timestamp"]},
        "rm_dup_inter": None, "val_interval": None, "filter_inter_by_user_or_item": False,
        "user_inter_num_interval": "[0,inf)", "item_inter_num_interval": "[0,inf)",
        "MAX_ITEM_LIST_LENGTH": args.max_len,
        "hidden_size": args.dim, "n_layers": args.layers, "n_heads": args.heads,
        "inner_size": args.inner, "hidden_dropout_prob": args.dropout,
        "attn_dropout_prob": args.attn_dropout, "hidden_act": "gelu",
        "layer_norm_eps": 1e-12, "initializer_range": 0.02, "loss_type": "CE",
        "train_neg_sample_args": None, "learner": "adam", "learning_rate": args.lr,
        "weight_decay": 0.0, "epochs": args.epochs, "train_batch_size": args.batch,
        "eval_batch_size": args.eval_batch, "shuffle": True, "eval_step": args.epochs + 1,
        "stopping_step": args.epochs + 1,
        "eval_args": {"split": {"LS": "test_only"}, "group_by": "user", "order": "TO",
                      "mode": "full"},
        "repeatable": True, "metrics": ["Recall", "NDCG", "MRR", "Hit"], "topk": [K],
        "valid_metric": f"NDCG@{K}", "metric_decimal_place": 6,
    }


def numpy2_shims() -> None:
    """Put back the aliases RecBole 1.2.1 needs and numpy 2 removed: ``Config`` runs
    ``np.float = np.float_`` (and ``complex_``, ``unicode_``), and its metrics use ``np.float``."""
    for name, alias in (("float_", np.float64), ("complex_", np.complex128),
                        ("unicode_", np.str_)):
        if name not in vars(np):
            setattr(np, name, alias)


@contextmanager
def working_dir(path: Path) -> Iterator[None]:
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def history_index(dataset, seqs: dict[str, list[str]]) -> list[torch.Tensor]:
    """Internal user id -> internal ids of all its items but the last (the test target)."""
    hist = [torch.zeros(0, dtype=torch.int64)] * dataset.user_num
    users = dataset.token2id(dataset.uid_field, list(seqs))
    for uid, items in zip(np.atleast_1d(users), seqs.values(), strict=True):
        if len(items) > 1:
            ids = dataset.token2id(dataset.iid_field, items[:-1])
            hist[int(uid)] = torch.as_tensor(np.atleast_1d(ids), dtype=torch.int64)
    return hist


def mask_history(trainer, hist: list[torch.Tensor], uid_field: str) -> None:
    """Make ``trainer``'s full-sort eval leave each user's earlier items out (target kept)."""
    stock = trainer._full_sort_batch_eval

    def masked(batched_data):
        interaction, scores, positive_u, positive_i = stock(batched_data)
        uids = interaction[uid_field].tolist()
        rows = torch.cat([torch.full((len(hist[u]),), r, dtype=torch.int64)
                          for r, u in enumerate(uids)])
        cols = torch.cat([hist[u] for u in uids]).to(scores.device)
        own = scores[positive_u, positive_i].clone()
        scores[rows.to(scores.device), cols] = -np.inf
        scores[positive_u, positive_i] = own
        return interaction, scores, positive_u, positive_i

    trainer._full_sort_batch_eval = masked


def pick(result: dict) -> dict[str, float]:
    return {name: float(result[name]) for name in (f"recall@{K}", f"ndcg@{K}", f"mrr@{K}",
                                                   f"hit@{K}")}


def run(args: argparse.Namespace) -> dict:
    import recbole
    from recbole.config import Config
    from recbole.data import create_dataset, data_preparation
    from recbole.model.sequential_recommender import SASRec
    from recbole.trainer import Trainer
    from recbole.utils import init_seed

    # importing recbole.model.sequential_recommender imports sine.py, which turns autograd's
    # anomaly detection on for the whole process (a NaN check after every backward op: about a
    # third of SASRec's step time here); it changes no number, so it is turned back off.
    anomaly = torch.is_anomaly_enabled()
    torch.autograd.set_detect_anomaly(False)
    numpy2_shims()
    seqs = read_sequences(args.data)
    with tempfile.TemporaryDirectory(prefix="peer_recbole_") as tmp, working_dir(Path(tmp)):
        root = Path(tmp)
        write_atomic(seqs, root)
        argv, sys.argv = sys.argv, sys.argv[:1]  # Config would also parse our --options
        try:
            config = Config(model="SASRec", dataset=DATASET,
                            config_dict=recbole_config(args, root))
        finally:
            sys.argv = argv
        init_seed(config["seed"], config["reproducibility"])
        torch.set_num_threads(args.threads)
        dataset = create_dataset(config)
        train_data, _valid, test_data = data_preparation(config, dataset)
        init_seed(config["seed"], config["reproducibility"])
        model = SASRec(config, train_data._dataset).to(config["device"])
        trainer = Trainer(config, model)
        print(f"data: {len(train_data._dataset)} training samples, {len(test_data._dataset)} "
              f"test users, {dataset.item_num - 1} items", file=sys.stderr, flush=True)
        epoch_s, losses = [], []
        for epoch in range(args.epochs):
            t0 = time.perf_counter()
            losses.append(float(trainer._train_epoch(train_data, epoch, show_progress=False)))
            epoch_s.append(time.perf_counter() - t0)
            print(f"epoch {epoch + 1}/{args.epochs}: loss {losses[-1]:.2f}, "
                  f"{epoch_s[-1]:.1f} s", file=sys.stderr, flush=True)
        stock = pick(trainer.evaluate(test_data, load_best_model=False))
        mask_history(trainer, history_index(dataset, seqs), dataset.uid_field)
        masked = pick(trainer.evaluate(test_data, load_best_model=False))
        trainer.tensorboard.close()
        train_samples, test_users = len(train_data._dataset), len(test_data._dataset)
        n_items = dataset.item_num - 1
    train_s = sum(epoch_s)
    return {
        "peer": f"recbole {recbole.__version__} SASRec",
        "protocol": ("leave-one-out by time: each user's last item is the test target, the rest "
                     "training (eval_args split {'LS': 'test_only'}, no validation split, no "
                     "early stopping); training samples = every prefix (RecBole's sequential "
                     "augmentation, last max_len items); full ranking over all "
                     f"{n_items} items, the user's earlier items masked (RecBole's stock "
                     "sequential eval masks none: see recbole_default_unmasked); final weights"),
        "hyper": {"MAX_ITEM_LIST_LENGTH": args.max_len, "hidden_size": args.dim,
                  "n_layers": args.layers, "n_heads": args.heads, "inner_size": args.inner,
                  "hidden_dropout_prob": args.dropout, "attn_dropout_prob": args.attn_dropout,
                  "hidden_act": "gelu", "layer_norm_eps": 1e-12, "initializer_range": 0.02,
                  "loss_type": "CE", "learner": "adam", "learning_rate": args.lr,
                  "train_batch_size": args.batch, "eval_batch_size": args.eval_batch,
                  "device": "cpu", "torch_threads": args.threads},
        "recall@10": masked[f"recall@{K}"], "ndcg@10": masked[f"ndcg@{K}"],
        "mrr@10": masked[f"mrr@{K}"], "hit@10": masked[f"hit@{K}"],
        "recbole_default_unmasked": stock,
        "users": len(seqs), "items": n_items, "test_users": test_users,
        "train_samples": train_samples, "train_seconds": train_s,
        "seconds_per_epoch": train_s / max(args.epochs, 1),
        "samples_per_s": train_samples * args.epochs / train_s if train_s > 0 else None,
        "epoch_seconds": epoch_s, "epoch_loss": losses,
        "epochs": args.epochs, "seed": args.seed,
        "recbole_anomaly_detection_turned_off": anomaly,
        "torch": torch.__version__, "numpy": np.__version__,
    }


def on_sigterm(signum: int, _frame: object) -> None:
    print(f"stopped by signal {signum}", file=sys.stderr, flush=True)
    sys.exit(128 + signum)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.data = args.data.resolve()
    out = args.json.resolve() if args.json else None
    logging.getLogger().setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=FutureWarning)  # recbole's pandas fillna
    # a SIGTERM unwinds like Ctrl-C, so the temporary directory is still removed
    signal.signal(signal.SIGTERM, on_sigterm)
    result = run(args)
    print(f"{result['peer']}: {result['epochs']} epochs, seed {result['seed']}: "
          f"recall@10 {result['recall@10']:.4f}  ndcg@10 {result['ndcg@10']:.4f}  "
          f"mrr@10 {result['mrr@10']:.4f}  (unmasked: recall@10 "
          f"{result['recbole_default_unmasked']['recall@10']:.4f}, ndcg@10 "
          f"{result['recbole_default_unmasked']['ndcg@10']:.4f})")
    sps = result["samples_per_s"]
    print(f"train {result['train_samples']} samples/epoch, {result['train_seconds']:.1f} s "
          f"({result['seconds_per_epoch']:.1f} s/epoch"
          + (f", {sps:.0f} samples/s)" if sps else ")"))
    if out:
        out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
