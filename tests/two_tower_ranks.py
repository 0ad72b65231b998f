"""Run by ``torchrun --nproc-per-node 2``: trains a retrieval model's config (``model.kind:
two_tower`` of ``tests/test_two_tower.py``, ``sasrec`` of ``tests/test_sasrec.py``) on the ranks
(its one table row-wise; the in-batch softmax over the global batch's items, gathered with their
gradient), and saves rank 0's losses, metrics and dense weights."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from cosparse.api.factory import make_trainer
from cosparse.config import config_from_mapping


def main(config: str, out: str) -> None:
    dist.init_process_group("gloo")
    raw = {**json.loads(config), "parallel": {"sharding": {"ids": "row_wise"}}}
    trainer = make_trainer(config_from_mapping(raw), log=lambda m: None)
    try:
        final = trainer.run()
        if dist.get_rank() == 0:
            torch.save({"losses": list(trainer.losses), "metrics": final,
                        "dense": {k: v.detach().cpu()
                                  for k, v in trainer.model.state_dict().items()}}, Path(out))
    finally:
        trainer.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
