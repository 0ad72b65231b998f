"""The feasibility check every tuning proposal passes before it is applied
(``cosparse.autotune.feasible``): the live agent skips and journals a proposal it refuses, and
the offline agent prunes such a trial instead of running it into a crash (that one:
``tests/test_autotune.py``, on its search's fixture)."""

from __future__ import annotations

import copy

import optuna
from test_autotune import TIERED

from cosparse.autotune.feasible import live_refusal, mapping_refusal
from cosparse.autotune.knobs import apply
from cosparse.autotune.live import LiveAgent
from cosparse.autotune.types import Budgets
from cosparse.config import config_from_mapping


def test_the_check_refuses_what_the_config_or_the_tiers_cannot_take():
    assert mapping_refusal(apply(TIERED, {"store.device.rows": 2400}), Budgets()) is None
    why = mapping_refusal(apply(TIERED, {"store.device.rows": 4800}), Budgets())
    assert "store.device.rows 4800 is over store.host.rows 3000" in why
    why = mapping_refusal(apply(TIERED, {"store.host.rows": 6000}), Budgets(host_bytes=5000 * 36))
    assert "over the host budget of 180,000 bytes (cosparse tune --budget host=)" in why
    why = mapping_refusal(apply(TIERED, {"store.device.rows": 1200}),
                          Budgets(device_bytes=1000 * 36))
    assert "store.device.rows 1200 x 36 bytes a row = 43,200 bytes" in why
    why = mapping_refusal(apply(TIERED, {"supply.horizon": -1}), Budgets())
    assert why.startswith("the config validation refuses it: supply.horizon")
    start = config_from_mapping(copy.deepcopy(TIERED))
    assert live_refusal(start, {"store.device.rows": 1200}, Budgets()) is None
    assert "over store.host.rows 3000" in live_refusal(start, {"store.device.rows": 9600},
                                                        Budgets())
    assert start.store.device.rows == 600  # (the start is left as it was)


def _rec(step: int, sps: float, **more: float) -> dict:
    return {"step": step, "samples_per_s": sps, "stage_ms.plan": 5.0, "stage_ms.fill": 5.0,
            "stage_ms.read": 1.0, "step_ms_p50": 20.0, "hit_rate.device": 0.5, **more}


def test_the_live_agent_never_grows_the_device_tier_past_the_host_tier(tmp_path):
    """store.device.rows a knob, store.host.rows not (3,000), a device budget of 16x the
    start's: the largest size it tries is the largest within the host tier (2,400), and the
    next rung (4,800) is skipped with its reason, journaled, never applied."""
    raw = copy.deepcopy(TIERED)
    raw["train"].update(log_every=2, autotune={"knobs": ["store.device.rows"], "every": 8,
                                               "device_budget": 16 * 600 * 36})
    said: list[str] = []
    agent = LiveAgent(config_from_mapping(raw), tmp_path / "j.log", log=said.append)
    assert agent.ladders["store.device.rows"][-1] == 9600
    steps = iter(range(2, 1000, 2))
    for v in [1, 1, 1, 1, 100, 100, 100, 100]:  # skipped, then the base window
        answer = agent(_rec(next(steps), v, **{"evictions.device": 5}))
    assert answer.changes == {"store.device.rows": 2400}
    agent(_rec(next(steps), 1))  # the restart
    for _ in range(3):  # full again, and faster: kept; then 4,800 is proposed, and refused
        answer = agent(_rec(next(steps), 200, **{"evictions.device": 7}))
    assert answer is None and agent.current == {"store.device.rows": 2400}
    assert [c["to"] for c in agent.changes] == [2400] and agent.changes[0]["kept"]
    (refused,) = agent.refused
    assert refused["to"] == 4800 and "over store.host.rows 3000" in refused["refused"]
    assert any("skipped store.device.rows 2400 -> 4800, infeasible" in s for s in said)
    study = optuna.load_study(study_name="cosparse-live", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "j.log"))))
    pruned = [t for t in study.get_trials() if t.state == optuna.trial.TrialState.PRUNED]
    assert [t.params for t in pruned] == [{"store.device.rows": 4800}]
    assert "over store.host.rows" in pruned[0].user_attrs["refused"]
    assert pruned[0].user_attrs["git_sha"] and pruned[0].user_attrs["config_hash"]
