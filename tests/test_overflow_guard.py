"""Issue 31 item 7: finite gradients that would make rows or optimizer state NaN or infinite.

One PUSH of 1e20 overflows Adagrad's and row-wise Adagrad's accumulator (1e40 > float32's 3.4e38),
one of 1e30 Adam's second moment, and repeated pushes of 3e38 drive an SGD row to -inf. Such an
update is refused whole, nothing applied (rows, state, versions, the map as they were), and
counted, on a shard (``Shard.push``) and on the trainer (``SparseOptimizer.update`` on numba and
torch, and a resident table's ``apply_gradients``, which ends the run with exit 8). The real
shard process is covered in ``test_ps_fuzz.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cosparse import exits
from cosparse.config import OptimizerConfig, TableConfig
from cosparse.optim import NonFiniteUpdate, SparseOptimizer
from cosparse.ps.shard import Shard
from cosparse.ps.shard_table import NonFiniteResult
from cosparse.store.resident import ResidentTable

KINDS = ["sgd", "adagrad", "rowwise_adagrad", "adam"]
HUGE = {"sgd": 3e38, "adagrad": 1e20, "rowwise_adagrad": 1e20, "adam": 1e30}
PUSHES = {"sgd": 2, "adagrad": 1, "rowwise_adagrad": 1, "adam": 1}  # until the result overflows


def _cfg(kind: str, dim: int = 8) -> TableConfig:
    return TableConfig(name="t", dim=dim, optimizer=OptimizerConfig(kind=kind, lr=1.0), seed=5)


def _huge_grads(kind: str, n: int, dim: int, row: int) -> np.ndarray:
    g = np.random.default_rng(1).standard_normal((n, dim)).astype(np.float32) * 0.01
    g[row] = HUGE[kind]
    return g


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind", KINDS)
def test_shard_refuses_a_push_whose_result_overflows_and_applies_nothing(kind, threads):
    sh = Shard(0, 1, threads=threads)
    sh.register([_cfg(kind)])
    ids = np.arange(0, 40, 3, dtype=np.int64)  # 14 rows: the four-row path and its tail
    sh.push("t", ids, np.full((ids.shape[0], 8), 0.5, np.float32), 1)
    fresh = np.arange(1000, 1004, dtype=np.int64)  # new IDs in the refused push: not created
    push_ids = np.concatenate([ids, fresh])
    g = _huge_grads(kind, push_ids.shape[0], 8, row=9)
    for step in range(2, 2 + PUSHES[kind] - 1):  # SGD: the first 3e38 push still fits
        sh.push("t", push_ids, g, step)
    before_ids, before_rows = sh.dump("t")
    before_versions = sh.pull("t", before_ids, peek=True)[1]
    wc, rows = sh.write_counter, sh.rows
    with pytest.raises(NonFiniteResult, match=rf"table 't': refused a push whose result would be "
                                              rf"NaN or infinite in row ID {push_ids[9]}.*nothing "
                                              "was applied"):
        sh.push("t", push_ids, g, 9)
    after_ids, after_rows = sh.dump("t")
    assert np.array_equal(after_ids, before_ids) and sh.rows == rows
    assert np.array_equal(after_rows, before_rows)  # bit for bit: rows and optimizer state
    assert np.array_equal(sh.pull("t", before_ids, peek=True)[1], before_versions)
    assert sh.write_counter == wc
    assert sh.stats()["refused_nonfinite_pushes"] == 1
    assert np.isfinite(after_rows).all()
    # a normal push still works, on the same rows, and the duplicate check was left clean
    sh.push("t", push_ids, np.full((push_ids.shape[0], 8), 0.25, np.float32), 10)
    assert sh.rows == rows + (4 if PUSHES[kind] == 1 else 0)
    assert np.isfinite(sh.dump("t")[1]).all()


def _gathered(kind: str, u: int = 12, dim: int = 8):
    opt = SparseOptimizer(OptimizerConfig(kind=kind, lr=1.0))
    rng = np.random.default_rng(0)
    slab = np.abs(rng.standard_normal((40, dim + opt.state_width(dim)))).astype(np.float32)
    slots = rng.choice(40, u, replace=False).astype(np.int64)
    slots[3] = -1  # a row not admitted: skipped either way
    return opt, slab, slots, np.ascontiguousarray(slab[slots, :dim]), \
        np.ascontiguousarray(slab[slots, dim:])


@pytest.mark.parametrize("backend", ["numba", "torch"])
@pytest.mark.parametrize("kind", KINDS)
def test_trainer_optimizer_refuses_an_update_whose_result_overflows(kind, backend):
    opt, slab, slots, w, s = _gathered(kind)
    g = _huge_grads(kind, w.shape[0], 8, row=5)
    if kind == "sgd":
        w[5] = slab[slots[5], :8] = -3e38  # where the earlier 3e38 pushes left it
    before = slab.copy()
    args = (w, s, g, 3, slab, slots)
    if backend == "torch":
        args = (*(torch.from_numpy(a) for a in (w, s, g)), 3, torch.from_numpy(slab),
                torch.from_numpy(slots))
    with pytest.raises(NonFiniteUpdate, match=rf"the {kind} update at step 3 would make 1 of 11 "
                                              "rows .* NaN or infinite; refused, nothing applied"):
        opt.update(*args)
    assert np.array_equal(slab, before)
    g[5] = 0.01  # the same batch without the huge gradient is applied
    args = (w, s, g, 3, slab, slots) if backend == "numba" else \
        (*(torch.from_numpy(a) for a in (w, s, g)), 3, torch.from_numpy(slab),
         torch.from_numpy(slots))
    opt.update(*args)
    changed = ~np.all(slab == before, axis=1)
    assert changed.sum() >= 10 and np.isfinite(slab).all()  # (SGD: -3e38 - 0.01 == -3e38)


def test_a_resident_table_names_itself_and_the_run_exits_8():
    cfg = TableConfig(name="users", dim=4,
                      optimizer=OptimizerConfig(kind="rowwise_adagrad", lr=0.1), seed=2)
    rt = ResidentTable(cfg, torch.device("cpu"))
    slots = rt.slots_for(np.arange(6, dtype=np.int64))
    before = rt.slab.clone()
    w, s = rt.gather(slots)
    g = torch.full((6, 4), 1e20)
    with pytest.raises(NonFiniteUpdate, match="table 'users': the rowwise_adagrad update") as e:
        rt.apply_gradients(w, s, g, slots, 1)
    live = torch.from_numpy(slots)
    assert torch.equal(rt.slab[live], before[live])  # (the slots past them: never written)
    assert exits.report(e.value) == exits.NONFINITE


def test_a_client_of_a_real_shard_gets_a_non_finite_refusal_and_exit_8(tmp_path, capsys):
    """Through a ``ps serve`` process the refusal keeps its kind: the client raises
    ``PSNonFinite`` (its own wire code), and the run ends with exit 8 naming the table, not with
    "PS unavailable"."""
    from cosparse.ps import EmbeddedShards, PSNonFinite

    with EmbeddedShards(1, [_cfg("adagrad")], tmp_path / "ps") as sh, sh.client() as client:
        ids = np.arange(4, dtype=np.int64)
        before = client.pull("t", ids, with_state=True)
        with pytest.raises(PSNonFinite, match="table 't': refused a push") as ei:
            client.push("t", ids, _huge_grads("adagrad", 4, 8, 2), 1)
        after = client.pull("t", ids, with_state=True)
        np.testing.assert_array_equal(after.rows, before.rows)
        np.testing.assert_array_equal(after.versions, before.versions)
    assert exits.report(ei.value) == exits.NONFINITE
    assert "non-finite update" in capsys.readouterr().err
