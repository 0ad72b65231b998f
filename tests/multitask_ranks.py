"""Run by ``torchrun --nproc-per-node 2``: trains each multi-task kind of
``tests/multitask_model.py`` from its config on the ranks (its table row-wise), and saves rank
0's losses, metrics and dense weights per kind for ``tests/test_multitask_models.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from multitask_model import BUILD, mapping

from cosparse.api.factory import make_trainer
from cosparse.config import config_from_mapping


def main(csv: str, out: str) -> None:
    dist.init_process_group("gloo")
    got = {}
    for kind in sorted(BUILD):
        raw = {**mapping(Path(csv), kind), "parallel": {"sharding": {"ids": "row_wise"}}}
        trainer = make_trainer(config_from_mapping(raw), log=lambda m: None)
        try:
            final = trainer.run()
            got[kind] = {"losses": list(trainer.losses), "metrics": final,
                         "dense": {k: v.detach().cpu()
                                   for k, v in trainer.model.state_dict().items()}}
        finally:
            trainer.close()
    if dist.get_rank() == 0:
        torch.save(got, Path(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
