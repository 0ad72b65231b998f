"""The live tuning agent (``train.autotune``) in a real run: it changes live knobs between
intervals (the stream and planner restart at a batch boundary), keeps or rolls back each change
by a test of the windows' throughputs, journals every change, and the run trains the numbers it
trains without the agent, bit for bit."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import optuna
import pytest
from test_autotune import POOR as TUNE_START

from cosparse.autotune.live import LiveAgent
from cosparse.autotune.trial_run import row_digest
from cosparse.cli import main as cli_main
from cosparse.config import ConfigError, config_from_mapping
from cosparse.train.live import Reconfigure
from cosparse.train.trainer import Trainer

# the offline agent's tiny start, trained longer and logged every 2 steps
POOR = copy.deepcopy(TUNE_START)
POOR["data"]["synthetic"]["num_batches"] = 200
POOR["train"].update(steps=60, log_every=2, progress=False)
KNOBS = ["supply.lookahead", "supply.horizon", "data.workers", "data.queue_depth"]
# architecture B over one embedded shard, one data worker bringing the cold rows
B = copy.deepcopy(POOR)
B["data"]["workers"] = 1
B["store"]["host"] = {"rows": 3000, "policy": "lru", "spill": True, "spill_to": "remote"}
B["store"]["remote"] = {"num_shards": 1}
B["supply"]["path"] = "collaborative"


def _train(raw: dict, on_interval=None) -> tuple[list[float], str, Trainer]:
    t = Trainer(config_from_mapping(raw), log=print, on_interval=on_interval)
    try:
        t.run(evaluate=False)
        return list(t.losses), row_digest(t.ec.export_rows()), t
    finally:
        t.close()


@pytest.fixture(scope="module")
def plain() -> tuple[list[float], str]:
    """The losses and row digest of POOR trained without the agent (trained once, compared
    with by every test that changes knobs on POOR)."""
    losses, digest, _ = _train(POOR)
    return losses, digest


def test_live_changes_keep_the_run_bit_identical(tmp_path, plain):
    """The agent changes knobs every 8 steps (rolling back what does not pay): the losses and
    rows equal those of the same run without it, and every change is journaled."""
    raw = copy.deepcopy(POOR)
    raw["train"].update(autotune={"knobs": KNOBS, "every": 8},
                        metrics_json=str(tmp_path / "m.jsonl"))
    said: list[str] = []
    agent = LiveAgent(config_from_mapping(raw), tmp_path / "j.log", log=said.append)
    tuned = _train(raw, agent)
    assert tuned[0] == plain[0] and tuned[1] == plain[1]
    assert agent.changes, said  # it tried something
    records = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    applied = [r for r in records if r["kind"] == "reconfigure"]
    rolled = [c for c in agent.changes if not c["kept"]]
    assert len(applied) == len(agent.changes) + len(rolled) + (agent.trying is not None)
    assert all(r["by"] == "live agent (train.autotune)" and r["changes"] for r in applied)
    study = optuna.load_study(study_name="cosparse-live", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "j.log"))))
    logged = study.get_trials()
    assert len(logged) == len(agent.changes)
    for t, c in zip(logged, agent.changes, strict=True):
        assert t.params == c["params"] and t.user_attrs["kept"] == c["kept"]
        assert t.user_attrs["git_sha"] and t.user_attrs["config_hash"]
        assert t.user_attrs["windows"] and t.user_attrs["base_windows"]


def test_a_forced_change_sequence_is_exact(plain):
    """Whatever the agent decides, a run reconfigured every interval through every live knob
    and value trains the same numbers as one that never changes."""
    plan = iter([{"supply.lookahead": 2}, {"data.workers": 2}, {"supply.horizon": 8},
                 {"data.queue_depth": 1}, {"supply.lookahead": 8, "data.workers": 1},
                 {"supply.lookahead": 0}, {"data.workers": 0}, {"supply.horizon": 0}])
    changed = _train(POOR, lambda rec: Reconfigure(next(plan, {}), "test", "test"))
    assert changed[0] == plain[0] and changed[1] == plain[1]
    assert changed[2].cfg.supply.lookahead == 0 and changed[2].cfg.data.workers == 0


@pytest.mark.parametrize("knobs,why", [
    (["store.device.policy"], "cannot change while training"),
    (["supply.publish_every"], "publishes nothing"),
    (["supply.path"], "started on 'collaborative'"),
])
def test_bad_live_knobs_are_config_errors(knobs, why):
    raw = copy.deepcopy(POOR)
    raw["train"]["autotune"] = {"knobs": knobs, "every": 8}
    with pytest.raises(ConfigError, match=why):
        config_from_mapping(raw)


def test_cosparse_train_runs_the_live_agent(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # (its metrics directory under runs/ there)
    raw = copy.deepcopy(POOR)
    raw["train"].update(steps=30, autotune={"knobs": ["supply.lookahead"], "every": 8,
                                            "journal": str(tmp_path / "j.log")})
    path = tmp_path / "c.json"
    path.write_text(json.dumps(raw))
    assert cli_main(["train", "--config", str(path)]) == 0
    err = capsys.readouterr()
    assert "autotune: live agent on supply.lookahead" in err.out + err.err
    assert Path(tmp_path / "j.log").exists()


def test_a_window_too_short_to_compare_is_a_config_error():
    raw = copy.deepcopy(POOR)
    raw["train"]["autotune"] = {"knobs": KNOBS, "every": 6}  # 3 intervals of 2 steps
    with pytest.raises(ConfigError, match="at least 4 of its intervals"):
        config_from_mapping(raw)


def test_resizing_the_tiers_live_is_exact():
    """The device and host tiers grown and shrunk between intervals (victims written down as
    on any eviction, down to a spill store): the same numbers as tiers that never change."""
    raw = copy.deepcopy(POOR)
    raw["store"]["host"] = {"rows": 3000, "spill": True}
    plain = _train(raw)
    plan = iter([{"store.device.rows": 1200}, {"store.host.rows": 1200},
                 {"store.device.rows": 600, "store.host.rows": 6000}, {"store.host.rows": 800},
                 {"store.device.rows": 800}])
    changed = _train(raw, lambda rec: Reconfigure(next(plan, {}), "test", "test"))
    assert changed[0] == plain[0] and changed[1] == plain[1]
    t = changed[2]
    table = t.ec.tables["cat"]
    assert (table.dev.limit, table.host.limit) == (800, 800)
    assert t.sizing.plans["cat"].device_rows == 800
    assert table.host.size <= 800 and table.dev.size <= 800


def test_the_agent_grows_a_tier_within_its_budget(tmp_path, plain):
    """With the device rows a knob and a budget of 4x the start's bytes, every size it tries
    stays within the budget."""
    raw = copy.deepcopy(POOR)
    raw["train"]["autotune"] = {"knobs": ["store.device.rows"], "every": 8,
                                "device_budget": 4 * 600 * 36}
    agent = LiveAgent(config_from_mapping(raw), tmp_path / "j.log", log=print)
    assert agent.ladders["store.device.rows"] == (600, 1200, 2400)
    tuned = _train(raw, agent)
    assert tuned[0] == plain[0]
    assert all(c["to"] <= 2400 for c in agent.changes)


def test_a_size_knob_needs_a_budget():
    raw = copy.deepcopy(POOR)
    raw["train"]["autotune"] = {"knobs": ["store.device.rows"], "every": 8}
    with pytest.raises(ConfigError, match="device_budget"):
        config_from_mapping(raw)


def test_switching_b_to_the_trainers_own_pulls_and_back_is_exact():
    """supply.path live: B's workers stop bringing rows (the trainer pulls its misses over the
    same tiers), then bring them again, then stop: the same numbers as B throughout, and each
    interval's counters show who brought the rows."""
    plain = _train(B)
    plan = iter([{}, {}, {"supply.path": "ps-tiered"}, {}, {}, {}, {"supply.path": "collaborative"},
                 {}, {}, {}, {"supply.path": "ps-tiered"}])
    recs: list[dict] = []

    def switch(rec: dict) -> Reconfigure:
        recs.append(rec)
        return Reconfigure(next(plan, {}), "test", "test")

    changed = _train(B, switch)
    assert changed[0] == plain[0] and changed[1] == plain[1]
    delivered = [r["delivered_rows"] > 0 for r in recs]
    pulled = [r["miss_share.trainer_ps"] > 0.5 for r in recs]
    # intervals 4-6 and from 12 on pull, 1-3 and 8-10 are delivered (B's restarts: 7 and 11)
    assert all(delivered[:3]) and all(delivered[7:10]) and not any(delivered[3:6] + delivered[11:])
    assert all(pulled[3:6]) and all(pulled[11:])
    assert changed[2].cfg.supply.path == "ps-tiered" and not changed[2].path.fallbacks


def test_the_agent_stops_bs_workers_rows_when_the_cores_are_few(tmp_path):
    """Fed records of a B run whose workers bring most misses on 2 cores: the agent first
    tries the trainer's own pulls, keeps them when faster, and then leaves publish_every alone
    (no filter is published)."""
    raw = copy.deepcopy(B)
    raw["train"]["autotune"] = {"knobs": ["supply.publish_every", "supply.path"], "every": 8}
    agent = LiveAgent(config_from_mapping(raw), tmp_path / "j.log", log=print)
    agent.cores = 2
    steps = iter(range(2, 1000, 2))
    b = {"miss_share.delivered": 0.6, "miss_share.trainer_ps": 0.05, "stage_ms.plan": 90.0}
    for v in [1, 1, 1, 1, 100, 100, 100, 100]:
        answer = agent(_rec(next(steps), v, **b))
    assert answer.changes == {"supply.path": "ps-tiered"}
    assert "the workers bring 0.60 of the misses" in answer.reason
    for v in [1, 180, 181, 179]:
        answer = agent(_rec(next(steps), v, **{"miss_share.trainer_ps": 0.65}))
    assert answer is None and agent.current["supply.path"] == "ps-tiered"
    assert agent.changes[-1]["kept"] and agent.changes[-1]["to"] == "ps-tiered"


def _rec(step: int, sps: float, **more: float) -> dict:
    return {"step": step, "samples_per_s": sps, "stage_ms.plan": 5.0, "stage_ms.fill": 5.0,
            "stage_ms.read": 1.0, "step_ms_p50": 20.0, "hit_rate.device": 0.5, **more}


def test_the_agent_keeps_what_is_faster_and_rolls_back_the_rest(tmp_path):
    """Fed interval records (4 to a window): the first window is skipped, the second is the
    base; a change followed by a clearly faster window stays, one followed by a slower window
    is rolled back, and a fallback undoes the change under trial."""
    raw = copy.deepcopy(POOR)
    raw["train"]["autotune"] = {"knobs": ["supply.lookahead", "data.queue_depth"], "every": 8}
    agent = LiveAgent(config_from_mapping(raw), tmp_path / "j.log", log=print)
    step = 0

    def window(sps: list[float], **more: float) -> list[Reconfigure | None]:
        nonlocal step
        out = []
        for v in sps:
            step += 2
            out.append(agent(_rec(step, v, **more)))
        return out

    assert window([1, 1, 1, 1]) == [None] * 4  # the run's first window: not measured
    *_, first = window([100, 101, 99, 100])
    assert first.changes == {"supply.lookahead": 1}
    *_, second = window([500, 150, 149, 151])  # (the restart's interval is not counted)
    assert agent.current["supply.lookahead"] == 1 and second.changes == {"supply.lookahead": 2}
    *_, third = window([0, 120, 119, 121])
    assert third.changes == {"supply.lookahead": 1} and "rolled back" in third.reason
    assert [c["kept"] for c in agent.changes] == [True, False]
    *_, fourth = window([1, 150, 150, 151])  # measured again after the rollback, a new move
    assert fourth.changes == {"data.queue_depth": 8}
    (undo,) = window([140], fallbacks=1)
    assert undo.changes == {"data.queue_depth": 4} and "fell back" in undo.reason
    assert agent.trying is None and agent.current == {"supply.lookahead": 1,
                                                      "data.queue_depth": 4}


def test_a_resized_tier_is_measured_once_it_is_full_again(tmp_path):
    """After a tier grows, its intervals count only once it evicts again (or after two windows):
    a tier with free slots is fast for a while whatever its size is worth."""
    raw = copy.deepcopy(POOR)
    raw["train"]["autotune"] = {"knobs": ["store.device.rows"], "every": 8,
                                "device_budget": 4 * 600 * 36}
    agent = LiveAgent(config_from_mapping(raw), tmp_path / "j.log", log=print)
    steps = iter(range(2, 1000, 2))
    for v in [1, 1, 1, 1, 100, 100, 100, 100]:  # skipped, then the base window
        answer = agent(_rec(next(steps), v, **{"evictions.device": 5}))
    assert answer.changes == {"store.device.rows": 2400}
    agent(_rec(next(steps), 1))  # the restart
    for _ in range(5):  # filling: fast, and not measured
        assert agent(_rec(next(steps), 1000)) is None and agent.window == []
    for _ in range(3):  # full again: measured, no faster than before
        answer = agent(_rec(next(steps), 100, **{"evictions.device": 7}))
    assert answer.changes == {"store.device.rows": 600} and "rolled back" in answer.reason


def test_after_patience_rollbacks_the_agent_settles_until_the_run_drifts(tmp_path):
    """Two changes in a row rolled back (patience 2): the agent stops trying, however much the
    counters argue, until a window is slower than the settled one beyond noise; then it tries
    again, the moves it rolled back allowed anew."""
    raw = copy.deepcopy(POOR)
    raw["train"]["autotune"] = {"knobs": ["supply.lookahead", "data.queue_depth"], "every": 8,
                                "patience": 2}
    agent = LiveAgent(config_from_mapping(raw), tmp_path / "j.log", log=print)
    steps = iter(range(2, 10_000, 2))

    def window(sps: list[float]) -> Reconfigure | None:
        return [agent(_rec(next(steps), v)) for v in sps][-1]

    window([1, 1, 1, 1])  # the run's first window: not measured
    assert window([100, 101, 99, 100]).changes == {"supply.lookahead": 1}
    assert "rolled back" in window([0, 90, 91, 89]).reason
    assert window([100, 101, 99, 100]).changes == {"data.queue_depth": 8}
    undo = window([0, 95, 94, 96])
    assert undo.changes == {"data.queue_depth": 4} and agent.settled
    assert [c["kept"] for c in agent.changes] == [False, False]
    window([0, 100, 102, 101])  # the reference: measured once the rollback restarted
    for _ in range(5):  # steady, or noisy but not slower beyond noise: no change
        assert window([99, 101, 100, 98]) is None and window([96, 104, 100, 97]) is None
    assert window([60, 61, 59, 60]) is None and agent.settled  # one slow window: not yet
    assert window([100, 101, 99, 100]) is None
    assert window([60, 61, 59, 60]) is None and agent.settled
    woke = window([61, 60, 62, 59])  # two in a row: the run drifted; what was slower may pay
    assert not agent.settled and woke.changes == {"supply.lookahead": 1}
    assert len(agent.changes) == 2
