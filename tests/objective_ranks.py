"""Run by ``torchrun --nproc-per-node 2``: trains the two-task model of
``tests/objective_model.py`` on the ranks, and saves rank 0's losses and final metrics for
``tests/test_objective.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from objective_model import TwoTasks, mapping

import cosparse


def main(csv: str, out: str) -> None:
    dist.init_process_group("gloo")
    with cosparse.Trainer(TwoTasks(), mapping(Path(csv)), log=lambda m: None) as trainer:
        result = trainer.fit()
        if dist.get_rank() == 0:
            torch.save({"losses": result.losses, "metrics": result.metrics}, Path(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
