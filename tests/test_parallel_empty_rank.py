"""A rank that holds no table (issue 32, item 6): 2 gloo ranks, one table, which the planner
puts whole on rank 0, in tiers under a device byte budget as in the demo, checkpointed. Rank 1
holds nothing yet sends its samples' IDs to rank 0 and trains its part of the dense model."""

from __future__ import annotations

from tests.test_parallel import _ckpt, _compare, _merged, _one_process, _torchrun, base

STEPS = 8


def one_table() -> dict:
    cfg = base({"all": "table_wise"}, 0.0, store={"device": {"budget_bytes": "4MiB"}},
               supply={"lookahead": 2})
    cfg["tables"] = [{"name": "all", "dim": 8, "features": ["C1", "C2", "C3", "C4", "C5", "C6"],
                      "optimizer": {"kind": "rowwise_adagrad", "lr": 0.05}}]
    return cfg


def test_a_rank_with_no_table_trains_and_checkpoints(tmp_path):
    cfg = _ckpt(one_table(), tmp_path / "ckpt", STEPS // 2, STEPS // 2)
    cfg["train"]["log_every"] = 2  # metrics and health checks on the empty rank too
    _torchrun(2, [{"name": "empty_rank", "config": cfg}], tmp_path, 120)
    got = _merged("empty_rank", tmp_path, cfg)
    assert got["plan"].world_size == 2
    assert [o for s in got["plan"].tables.values() for o in s.owners] == [0]  # as in the demo
    assert got["ranks"][1]["rows"] == {} or not any(
        len(r["ids"]) for r in got["ranks"][1]["rows"].values())
    assert got["ranks"][1]["comm"]["sent_bytes"] > 0  # its samples' IDs went to rank 0
    half, whole = one_table(), one_table()
    half["train"].update(steps=STEPS // 2, log_every=STEPS)
    whole["train"].update(steps=STEPS, log_every=STEPS)
    _compare("empty_rank", got, _one_process(half), cfg, exact=True)
    # the 2-rank checkpoint (rank 1's part empty) resumes on one process, to STEPS
    again = _ckpt(one_table(), tmp_path / "again", STEPS)
    resumed = _one_process(again, resume=tmp_path / "ckpt")
    _compare("empty_rank_resumed", resumed, _one_process(whole), cfg, exact=True)
