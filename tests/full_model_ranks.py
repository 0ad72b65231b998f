"""Run by ``torchrun --nproc-per-node 2``: trains the done-when model of ``tests/full_model.py``
on the ranks with the sharding given as JSON, and saves rank 0's losses, dense weights and final
metrics for ``tests/test_public_full_model.py``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from full_model import mapping, new_model

import cosparse


def main(csv: str, sharding: str, out: str) -> None:
    dist.init_process_group("gloo")
    model = new_model()
    raw = {**mapping(Path(csv)), "parallel": {"sharding": json.loads(sharding)}}
    with cosparse.Trainer(model, raw, log=lambda m: None) as trainer:
        result = trainer.fit()
        if dist.get_rank() == 0:
            torch.save({"losses": result.losses, "metrics": result.metrics,
                        "dense": {k: v.detach().cpu() for k, v in model.state_dict().items()}},
                       Path(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
