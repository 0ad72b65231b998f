"""bench_quality's sequence family, cosparse's side: SASRec of ``configs/beauty_sasrec.yaml`` on
Amazon Beauty (the S3-Rec file: leave-one-out, the whole corpus ranked, each user's earlier
items left out), trained per seed and on the tiered and collaborative placements. The peer,
RecBole's SASRec (``benchmarks/peer_recbole_sasrec.py``), reads the same file.

A quick run trains both on the first ``QUICK_USERS`` users' lines (a file in a temporary
folder): one RecBole epoch of the whole file takes minutes here.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import REPO
from benchmarks.quality_multitask import placements_equal, train

CONFIG = REPO / "configs/beauty_sasrec.yaml"
BEAUTY = REPO.parent / "shared/data/seqrec-s3rec/Beauty.txt"
QUICK_USERS = 500
PEER = "benchmarks.peer_recbole_sasrec"
# the figure a paper publishes for this protocol: SASRec on this Beauty (22,363 users, 12,101
# items), leave-one-out, every item ranked; the line of work trains on items[:-2] and picks the
# best epoch on the second-last item, which this benchmark does not do
PUBLISHED: dict[str, Any] = {
    "recall@10": 0.0605, "ndcg@10": 0.0318,
    "source": "Hua et al., How to Index Item IDs for Recommendation Foundation Models, "
              "SIGIR-AP 2023, Table 2 (SASRec baseline on Amazon Beauty; its preprocessing is "
              "P5's, of the same size as this file, not checked byte for byte)"}
__all__ = ["BEAUTY", "CONFIG", "PUBLISHED", "config_epochs", "epoch_steps", "mapping", "placements_equal",
           "run_peer", "subset", "train"]


def mapping(path: Path, epochs: int, seed: int) -> dict[str, Any]:
    """The config as a mapping over ``path``, ``epochs`` epochs, the model's initial weights
    drawn from ``seed``."""
    raw = yaml.safe_load(CONFIG.read_text())
    raw["data"]["path"] = str(path)
    raw["train"].update(seed=seed, epochs=epochs, log_every=10**6, progress=False)
    return raw


def config_epochs() -> int:
    """The config's ``train.epochs``."""
    return int(yaml.safe_load(CONFIG.read_text())["train"]["epochs"])


def epoch_steps(raw: dict[str, Any]) -> int:
    """The steps of one epoch of ``raw``'s training split."""
    from cosparse.config import config_from_mapping
    from cosparse.train.inputs import model_inputs

    return int(model_inputs(config_from_mapping(raw)).train.num_batches)


def subset(path: Path, users: int) -> Path:
    """A file of the first ``users`` lines of Beauty.txt."""
    with BEAUTY.open() as f:
        path.write_text("".join(line for _, line in zip(range(users), f, strict=False)))
    return path


def hyper(raw: dict[str, Any]) -> list[str]:
    """The peer's options for the config's model and training: the same hyperparameters."""
    s, m = raw["model"]["sasrec"], raw["model"]
    return ["--max-len", str(raw["data"]["events"]["max_len"]), "--dim",
            str(raw["tables"][0]["dim"]), "--layers", str(s["layers"]), "--heads",
            str(s["heads"]), "--inner", str(s["inner"]), "--dropout", str(m["dropout"]),
            "--attn-dropout", "0", "--lr", str(m["dense_optimizer"]["lr"]), "--batch",
            str(raw["data"]["batch_size"])]


def run_peer(python: Path, raw: dict[str, Any], seeds: list[int], timeout_s: float
             ) -> tuple[list[dict[str, Any]] | None, str]:
    """RecBole's run of each seed on the config's file, or None and why not."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="cosparse-recbole-") as tmp:
        for seed in seeds:
            out = Path(tmp) / f"seed{seed}.json"
            cmd = [str(python), "-m", PEER, "--data", raw["data"]["path"], "--epochs",
                   str(raw["train"]["epochs"]), "--seed", str(seed), "--json", str(out),
                   *hyper(raw)]
            try:
                done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                                      timeout=timeout_s)
            except subprocess.TimeoutExpired:
                return None, f"RecBole ran past {timeout_s:.0f} s (seed {seed})"
            if done.returncode != 0:
                return None, f"RecBole failed (exit {done.returncode}): {done.stderr[-1500:]}"
            got = json.loads(out.read_text())
            print(f"sequence: RecBole seed {seed}: recall@10 {got['recall@10']:.4f} ndcg@10 "
                  f"{got['ndcg@10']:.4f} {got['samples_per_s']:.0f} samples/s", flush=True)
            runs.append(got)
    return runs, ""
