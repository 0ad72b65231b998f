"""train.cpu: how the run's cores are divided between the trainer and its workers and shards,
and that the trainer applies it before it trains."""

import copy

import pytest
import torch

from cosparse.config import ConfigError, config_from_mapping
from cosparse.train.cpu_budget import cpu_shares, plan_cpu, usable_cores

BASE = {
    "data": {"reader": "synthetic", "batch_size": 32},
    "model": {"kind": "dlrm", "bottom": [8, 4], "top": [8, 1]},
    "tables": [{"name": "t", "dim": 4, "features": ["C1", "C2"]}],
    "train": {"steps": 2, "progress": False},
}


@pytest.mark.parametrize("cores, threads, reserve, workers, shards, want", [
    (2, "auto", 0, 2, 2, (0, 2)),  # the default: every core to the trainer
    (2, "auto", "auto", 2, 2, (1, 1)),  # a core per helper, but the trainer keeps one
    (8, "auto", "auto", 2, 2, (4, 4)),
    (8, "auto", "auto", 0, 0, (0, 8)),
    (4, "auto", 5, 0, 0, (3, 1)),  # an explicit reserve past the cores: the trainer keeps one
    (2, 3, "auto", 2, 0, (1, 3)),  # explicit threads: the user's choice, even past the cores
    (1, "auto", "auto", 2, 2, (0, 1)),
])
def test_plan_divides_the_cores(cores, threads, reserve, workers, shards, want):
    s = plan_cpu(cores, threads, reserve, workers, shards)
    assert (s.reserved, s.trainer_threads) == want
    assert s.child_threads == 1 and s.helpers == workers + shards and s.cores == cores
    assert f"{s.cores} cores" in s.describe()


def test_shares_of_a_config_count_its_workers_and_embedded_shards():
    raw = copy.deepcopy(BASE)
    raw["data"]["workers"] = 2
    raw["train"]["cpu"] = {"reserve_for_workers": "auto"}
    assert cpu_shares(config_from_mapping(raw), cores=8).helpers == 2  # resident: no shards
    raw["supply"] = {"path": "ps-direct"}
    raw["store"] = {"remote": {"num_shards": 3}}
    s = cpu_shares(config_from_mapping(raw), cores=8)
    assert (s.helpers, s.reserved, s.trainer_threads) == (5, 5, 3)
    raw["store"]["remote"].update(embedded=False, endpoints=["tcp://127.0.0.1:1"])
    assert cpu_shares(config_from_mapping(raw), cores=8).helpers == 2  # external shards
    raw["train"]["threads"] = 2  # the older key still sets the trainer's threads
    assert cpu_shares(config_from_mapping(raw), cores=8).trainer_threads == 2


def test_threads_and_cpu_threads_that_disagree_are_refused():
    raw = copy.deepcopy(BASE)
    raw["train"].update(threads=1, cpu={"threads": 2})
    with pytest.raises(ConfigError, match=r"train.threads \(1\) and train.cpu.threads \(2\)"):
        config_from_mapping(raw)
    raw["train"]["cpu"] = {"threads": 0}
    with pytest.raises(ConfigError, match="train.cpu.threads"):
        config_from_mapping(raw)
    raw["train"]["cpu"] = {"threads": "all"}
    with pytest.raises(ConfigError, match="train.cpu.threads"):
        config_from_mapping(raw)


def test_the_trainer_applies_its_budget():
    from cosparse.train.trainer import Trainer

    before = torch.get_num_threads()
    try:
        for threads, want in ((1, 1), ("auto", usable_cores())):
            raw = copy.deepcopy(BASE)
            raw["train"]["cpu"] = {"threads": threads}
            t = Trainer(config_from_mapping(raw), log=lambda m: None)
            try:
                assert t.cpu.trainer_threads == want and torch.get_num_threads() == want
                final = t.run()
                assert final["cpu"]["trainer_threads"] == want  # the run summary says it
            finally:
                t.close()
    finally:
        torch.set_num_threads(before)
