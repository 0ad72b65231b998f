"""train.steps and train.epochs (issue 32, item 4): `epochs` alone trains that many passes, past
the 1000 steps that `steps` defaults to; both: the first limit reached ends the run, and one log
line says which; neither: 1000 steps, one pass at most."""

from __future__ import annotations

import copy

from cosparse.config import config_from_mapping
from cosparse.config.train import DEFAULT_STEPS, run_limits
from cosparse.train.trainer import Trainer

TINY = {
    "data": {"reader": "synthetic", "batch_size": 4, "workers": 0,
             "synthetic": {"num_features": 1, "num_dense": 1, "vocab_size": 50, "bag_min": 1,
                           "bag_max": 1, "seed": 3, "num_batches": 5, "eval_batches": 1}},
    "model": {"kind": "dlrm", "bottom": [4], "top": [4, 1],
              "dense_optimizer": {"kind": "adagrad", "lr": 0.01}},
    "tables": [{"name": "a", "dim": 4, "features": ["C1"],
                "optimizer": {"kind": "adagrad", "lr": 0.1}}],
    "train": {"progress": False, "log_every": 10_000, "threads": 1},
}


def _train(batches: int, **train: int) -> tuple[Trainer, list[str]]:
    raw = copy.deepcopy(TINY)
    raw["data"]["synthetic"]["num_batches"] = batches
    raw["train"].update(train)
    lines: list[str] = []
    trainer = Trainer(config_from_mapping(raw), log=lines.append)
    try:
        trainer.run(evaluate=False)
    finally:
        trainer.close()
    return trainer, lines


def _limit_lines(lines: list[str]) -> list[str]:
    return [m for m in lines if "reached" in m and "train." in m]


def test_epochs_alone_train_every_epoch_past_the_default_steps():
    batches = 340  # 3 epochs: 1020 steps, more than DEFAULT_STEPS
    assert 3 * batches > DEFAULT_STEPS
    trainer, lines = _train(batches, epochs=3)
    assert trainer.state.step == 3 * batches and trainer.state.epoch == 3
    assert _limit_lines(lines) == []  # one limit given: nothing to choose between


def test_both_limits_stop_at_the_first_reached_and_say_which():
    trainer, lines = _train(5, epochs=2, steps=100)
    assert trainer.state.step == 10
    assert _limit_lines(lines) == [
        "train.epochs (2) reached at step 10, before train.steps (100): the run ends"]
    trainer, lines = _train(5, epochs=2, steps=7)
    assert trainer.state.step == 7 and trainer.state.epoch == 1
    assert _limit_lines(lines) == [
        "train.steps (7) reached at epoch 2 of train.epochs (2): the run ends at step 7"]


def test_neither_limit_keeps_the_default_and_steps_alone_one_epoch():
    cfg = config_from_mapping(copy.deepcopy(TINY))
    assert cfg.train.steps == DEFAULT_STEPS == 1000 and run_limits(cfg.train) == (1000, 1)
    trainer, lines = _train(5)
    assert trainer.state.step == 5 and _limit_lines(lines) == []
    trainer, _ = _train(5, steps=3)
    assert trainer.state.step == 3
