"""Capacity planning for every tier (``cosparse plan --tiers``): the recommended device and host
sizes under budgets, checked against a real run of the recommended config (hit rate per tier
within 5 points, PS bytes per step within 15%), and the drift between two workloads."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from cosparse.cli import main as cli_main
from cosparse.config import config_from_mapping
from cosparse.train.trainer import Trainer
from cosparse.tune.tiers import plan_tiers
from cosparse.tune.trace import build_traces

STEPS = 120
BASE = {
    "data": {"reader": "synthetic", "batch_size": 512, "workers": 0,
             "synthetic": {"num_features": 4, "num_dense": 2, "vocab_size": 50000,
                           "alpha": 1.05, "bag_min": 1, "bag_max": 4, "seed": 5,
                           "num_batches": 400, "eval_batches": 1}},
    "model": {"kind": "dlrm", "bottom": [8, 8], "top": [8, 1]},
    "tables": [{"name": f"t{i}", "dim": 8, "features": [f"C{i}"],
                "optimizer": {"kind": "rowwise_adagrad", "lr": 0.05}} for i in range(1, 5)],
    "supply": {"path": "ps-tiered", "lookahead": 1},
    "store": {"device": {"rows": 1000, "policy": "lru"},
              "host": {"rows": 5000, "policy": "lru", "spill": True, "spill_to": "remote"},
              "remote": {"num_shards": 1}},
    "train": {"steps": STEPS, "threads": 1, "log_every": STEPS // 2, "progress": False},
}


def test_the_prediction_holds_in_a_real_run_of_the_recommendation():
    """Budgets of 5% (device) and 25% (host) of the rows' bytes: the recommended tiers, run
    for real over the PS, reach the predicted hit rates and PS traffic once warm (the run's
    second half against the trace's second half)."""
    cfg = config_from_mapping(copy.deepcopy(BASE))
    traces = build_traces(cfg, STEPS, progress=False)
    every = sum(t.num_ids for t in traces) * 36  # 8 values and a row-wise Adagrad state
    rep = plan_tiers(cfg, traces, int(0.05 * every), int(0.25 * every), 16 << 30, ("lru",))
    assert rep.device_bytes <= 0.05 * every * 1.01 and rep.host_bytes <= 0.25 * every * 1.01
    run = copy.deepcopy(BASE)
    run["store"] = {**run["store"], **{k: {**run["store"][k], **v}
                                       for k, v in rep.store().items()}}
    intervals: list[dict] = []
    t = Trainer(config_from_mapping(run), log=print, on_interval=intervals.append)
    try:
        t.run(evaluate=False)
    finally:
        t.close()
    warm = intervals[-1]
    ps = (warm["bytes.trainer_ps.pull"] + warm["bytes.trainer_ps.push"]) / (STEPS // 2)
    print(f"device {rep.hit_rate_device:.3f} vs {warm['hit_rate.device']:.3f}, host "
          f"{rep.hit_rate_host:.3f} vs {warm['hit_rate.host']:.3f}, PS bytes/step "
          f"{rep.ps_bytes_per_step:,.0f} vs {ps:,.0f}")
    assert abs(rep.hit_rate_device - warm["hit_rate.device"]) <= 0.05
    assert abs(rep.hit_rate_host - warm["hit_rate.host"]) <= 0.05
    assert abs(rep.ps_bytes_per_step - ps) <= 0.15 * ps


def test_drift_between_two_weeks_and_the_json(tmp_path, capsys):
    """This week's IDs spread wider (Zipf 0.9 over a larger vocabulary): more distinct IDs, so
    larger tiers for the same share, and a lower device hit rate."""
    last = tmp_path / "last.yaml"
    last.write_text(yaml.safe_dump(BASE))
    this = copy.deepcopy(BASE)
    this["data"]["synthetic"].update(alpha=0.9, vocab_size=80000)
    now = tmp_path / "this.yaml"
    now.write_text(yaml.safe_dump(this))
    assert cli_main(["plan", "tiers", "--config", str(last), "--drift", str(now), "--steps",
                     "40", "--budget", "device=100KiB,host=1MiB", "--no-progress",
                     "--out", str(tmp_path / "o")]) == 0
    doc = json.loads((tmp_path / "o" / "tiers.json").read_text())
    d = doc["drift"]
    t1 = d["tables"]["t1"]
    assert t1["distinct_ids"][1] > t1["distinct_ids"][0]
    assert d["hit_rate_device"][1] < d["hit_rate_device"][0]
    assert doc["store"]["device"]["rows"] >= 1 and doc["ps_shards"] == 1
    assert "drift to" in capsys.readouterr().out


def test_a_host_budget_below_the_device_budget_is_refused():
    cfg = config_from_mapping(copy.deepcopy(BASE))
    with pytest.raises(ValueError, match="host tier holds the device's rows too"):
        plan_tiers(cfg, build_traces(cfg, 10, progress=False), 10**6, 10**5, 1 << 30)


@pytest.mark.parametrize("new, old", [
    (["plan", "tiers", "--config", "x.yaml", "--budget", "device=1MiB", "--steps", "3"],
     ["plan", "--tiers", "--config", "x.yaml", "--budget", "device=1MiB", "--steps", "3"]),
    (["plan", "sharding", "--config", "x.yaml", "--ranks", "4"],
     ["plan", "--sharding", "--config", "x.yaml", "--ranks", "4"]),
    (["plan", "cache", "--config", "x.yaml", "--steps", "5", "--lookahead", "2"],
     ["plan", "--config", "x.yaml", "--steps", "5", "--lookahead", "2"]),
])
def test_plan_subcommands_read_as_the_older_flags(new, old):
    from cosparse.cli import build_parser
    from cosparse.cli.plan import _plan

    a, b = build_parser().parse_args(new), build_parser().parse_args(old)
    assert a.func is b.func or b.func is _plan  # (the older spelling dispatches in _plan)
    for key in ("config", "steps", "budget", "ranks", "lookahead"):
        if hasattr(a, key):
            assert getattr(a, key) == getattr(b, key), key
