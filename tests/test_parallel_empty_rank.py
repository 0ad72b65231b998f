"""A rank that holds no table (issue 32, item 6): 2 gloo ranks, one table, which the planner
puts whole on rank 0, as in the demo. Rank 1 holds nothing, yet sends its samples' IDs to rank
0 and trains its part of the dense model: in tiers under a device byte budget (checkpointed,
and resumed on one process), and under architecture B (the data workers' rows over a PS)."""

from __future__ import annotations

import pytest

from tests.test_parallel import _ckpt, _compare, _merged, _one_process, _torchrun, arch, base

STEPS = 8
ONE_TABLE = [{"name": "all", "dim": 8, "features": ["C1", "C2", "C3", "C4", "C5", "C6"],
              "optimizer": {"kind": "rowwise_adagrad", "lr": 0.05}}]


def one_table(dense_lr: float = 0.0, steps: int = STEPS) -> dict:
    cfg = base({"all": "table_wise"}, dense_lr, store={"device": {"budget_bytes": "4MiB"}},
               supply={"lookahead": 2})
    cfg["tables"] = ONE_TABLE
    cfg["train"].update(steps=steps, log_every=steps)
    return cfg


def arch_b() -> dict:
    cfg = arch("arch-b", {"all": "table_wise"})
    cfg["tables"] = ONE_TABLE
    cfg["store"]["device"]["rows"], cfg["store"]["host"]["rows"] = 4000, 8000
    cfg["train"].update(steps=4, log_every=2)
    return cfg


def _rank_1_holds_nothing(got: dict) -> None:
    assert got["plan"].world_size == 2
    assert [o for s in got["plan"].tables.values() for o in s.owners] == [0]
    assert not any(len(r["ids"]) for r in got["ranks"][1]["rows"].values())
    assert got["ranks"][1]["comm"]["sent_bytes"] > 0  # its samples' IDs went to rank 0


@pytest.mark.chaos  # the 2-rank demo (issue 32, item 6) stays in the fault suite
def test_a_rank_with_no_table_trains_and_checkpoints(tmp_path):
    tiered = _ckpt(one_table(), tmp_path / "ckpt", STEPS // 2, STEPS // 2)
    tiered["train"]["log_every"] = 2  # metrics and health checks on the empty rank too
    _torchrun(2, [{"name": "tiered", "config": tiered}, {"name": "arch_b", "config": arch_b()}],
              tmp_path, 150)
    got = _merged("tiered", tmp_path, tiered)
    _rank_1_holds_nothing(got)
    _compare("empty_rank", got, _one_process(one_table(steps=STEPS // 2)), tiered, exact=True)
    # the 2-rank checkpoint (rank 1's part empty) resumes on one process, to STEPS
    resumed = _one_process(_ckpt(one_table(), tmp_path / "again", STEPS),
                           resume=tmp_path / "ckpt")
    _compare("empty_rank_resumed", resumed, _one_process(one_table()), tiered, exact=True)
    # architecture B: rank 1's data worker brings no rows, the one process's run all of them
    cfg = arch_b()
    got = _merged("arch_b", tmp_path, cfg)
    _rank_1_holds_nothing(got)
    _compare("empty_rank_arch_b", got, _one_process(one_table(0.05, cfg["train"]["steps"])),
             cfg, exact=False)
