"""Run by ``torchrun --nproc-per-node 2``: trains each case of a JSON file on the ranks and saves
what each rank holds (its shards' rows, the losses, the dense weights, the plan) for the test
to compare with one process (``tests/test_parallel.py``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from cosparse.config import config_from_mapping
from cosparse.train.trainer import Trainer


def main(cases_path: str, out_dir: str) -> None:
    dist.init_process_group("gloo")  # kept across the cases; each Trainer adds its own groups
    rank = dist.get_rank()
    for case in json.loads(Path(cases_path).read_text()):
        trainer = Trainer(config_from_mapping(case["config"]), log=lambda msg: None)
        try:
            if case.get("resume"):
                trainer.resume(case["resume"])
            final = trainer.run(evaluate=False)
            inner = getattr(trainer.ec, "inner", trainer.ec)  # (architecture A: not sharded)
            rows = inner.export_rows()
            torch.save({"rows": rows, "losses": trainer.losses,
                        "dense": get_model_state_dict(  # whole tensors, also under FSDP2
                            trainer.train_model,
                            options=StateDictOptions(full_state_dict=True, cpu_offload=True)),
                        "plan": trainer.ranks.plan, "comm": trainer.ranks.world.comm,
                        "final": final},
                       Path(out_dir) / f"{case['name']}.rank{rank}.pt")
            dist.barrier()  # rank 0's PS shards stay up until every rank has read its rows
        finally:
            trainer.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
