"""A ``Trainer.run`` that ends at its step count leaves its data stream open, and the next
``run`` goes on with it: the same data workers, the same batches as one run, and nothing left
running once the trainer is closed."""

from __future__ import annotations

import copy
import os

from cosparse.config import config_from_mapping
from cosparse.train.trainer import Trainer

RUN = {
    "data": {"reader": "synthetic", "batch_size": 64, "workers": 2,
             "synthetic": {"num_features": 4, "vocab_size": 3000, "bag_min": 1, "bag_max": 3,
                           "seed": 7, "num_batches": 40, "eval_batches": 1}},
    "model": {"kind": "dlrm", "bottom": [16, 8], "top": [16, 1]},
    "tables": [{"name": "a", "dim": 8, "features": [f"C{i}" for i in range(1, 5)]}],
    "train": {"steps": 12, "log_every": 100, "progress": False, "seed": 3},
}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_second_run_goes_on_with_the_first_runs_workers_and_batches():
    whole = Trainer(config_from_mapping(copy.deepcopy(RUN)), log=lambda m: None)
    try:
        whole.run(evaluate=False)
    finally:
        whole.close()
    t = Trainer(config_from_mapping(copy.deepcopy(RUN)), log=lambda m: None)
    try:
        t.run(steps=5, evaluate=False)
        first = set(t.data_worker_pids)
        assert len(first) == 2 and all(_alive(p) for p in first)  # kept open between runs
        t.run(evaluate=False)
        assert t.data_worker_pids == first  # no new workers were started
        assert t.losses == whole.losses  # the same batches, in the same order
    finally:
        t.close()
    assert not any(_alive(p) for p in first)


def test_a_run_that_ends_its_epochs_closes_its_stream():
    raw = copy.deepcopy(RUN)
    raw["data"]["synthetic"]["num_batches"] = 6
    raw["train"].update(epochs=1, steps=100)
    t = Trainer(config_from_mapping(raw), log=lambda m: None)
    try:
        t.run(evaluate=False)
        assert t.state.step == 6 and t.stream.closed
    finally:
        t.close()
