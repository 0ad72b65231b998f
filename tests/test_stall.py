"""No hang at a checkpoint, and a watchdog on every wait between the trainer and its threads.

Issue 11, defect 1: the planner thread used to wait for the trainer (a lookahead shrink) while
holding the table lock that the trainer's checkpoint export needs.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from cosparse.config import TableConfig
from cosparse.stall import Progress, StallError
from cosparse.store.planner import CachePlanner
from cosparse.store.tiered import TieredTable
from cosparse.train.prefetch import Prefetcher


def _tight_table() -> tuple[TieredTable, CachePlanner]:
    """A device tier of 100 rows and batches of 60 distinct rows: the second batch in flight
    leaves no room, so planning it must wait for the trainer (a lookahead shrink)."""
    table = TieredTable(TableConfig(name="t", dim=4, features=["a"]), torch.device("cpu"),
                        device_rows=100, host_rows=1000, spill=False)
    return table, CachePlanner({"t": table}, lookahead=4)


def _batch(i: int) -> dict[str, np.ndarray]:
    return {"t": np.arange(i * 60, i * 60 + 60, dtype=np.int64)}


def _plan_on_thread(planner: CachePlanner, batches: int) -> tuple[threading.Thread, list]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for i in range(batches):
                planner.plan(_batch(i))
        except BaseException as e:  # noqa: BLE001 - inspected by the test
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, errors


def test_checkpoint_export_while_planner_waits_for_trainer():
    """The trainer checkpoints (flush + export) while the planner is blocked in a shrink that
    waits for the trainer's next step: the export must not wait for the planner."""
    table, planner = _tight_table()
    thread, errors = _plan_on_thread(planner, 2)
    deadline = time.monotonic() + 60  # (a fresh clone compiles the numba kernels first)
    while planner._next < 1 and time.monotonic() < deadline:  # batch 0 planned
        time.sleep(0.01)
    time.sleep(0.3)  # the planner is now inside batch 1's shrink, waiting for batch 0
    assert thread.is_alive() and not errors
    done = threading.Event()
    exported: list[dict] = []

    def checkpoint() -> None:
        exported.append(table.flush_and_export())
        done.set()

    threading.Thread(target=checkpoint, daemon=True).start()
    # the planner may still hold the lock compiling make_room's kernels (not waiting on us)
    finished = done.wait(timeout=60)
    planner.mark_done()  # the trainer's next step: the planner goes on
    thread.join(timeout=10)
    assert finished, "checkpoint export blocked behind the planner's wait for the trainer"
    assert not errors and not thread.is_alive()
    assert exported[0]["ids"].shape[0] == 60  # batch 0's rows (batch 1's were not created yet)
    assert np.array_equal(np.sort(table.dev.slot_ids[table._pinned[1]]), _batch(1)["t"])


def test_planner_wait_raises_naming_both_sides_when_trainer_is_silent():
    _, planner = _tight_table()
    trainer = Progress("the trainer")
    trainer.beat("trained step 0")
    planner.watch(trainer, stall_timeout_s=1.0)
    t0 = time.monotonic()
    thread, errors = _plan_on_thread(planner, 2)
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], StallError), errors
    msg = str(errors[0])
    assert "cache planner" in msg and "the trainer" in msg and "trained step 0" in msg
    assert 0.9 < time.monotonic() - t0 < 30  # (plus a fresh clone's first numba compile)


def test_planner_waits_for_a_trainer_that_keeps_making_progress():
    """A shrink that waits for a trainer which is still busy (a long checkpoint that beats) is
    progress, not a stall."""
    _, planner = _tight_table()
    trainer = Progress("the trainer")
    planner.watch(trainer, stall_timeout_s=0.5)
    thread, errors = _plan_on_thread(planner, 2)
    end = time.monotonic() + 2.0
    while time.monotonic() < end:  # four stall timeouts' worth of a busy trainer
        trainer.beat("checkpoint at step 1: exporting rows")
        time.sleep(0.1)
    assert thread.is_alive() and not errors
    planner.mark_done()
    thread.join(timeout=10)
    assert not errors and not thread.is_alive()


def test_trainer_wait_for_a_stuck_prefetch_thread_names_both_sides():
    stuck = threading.Event()

    def source():
        yield 1
        stuck.wait(30)  # a data stream that never delivers its second batch
        yield 2

    prefetch = Prefetcher(source(), lambda x: x, lookahead=2, stall_timeout_s=1.0)
    it = iter(prefetch)
    assert next(it) == 1
    t0 = time.monotonic()
    with pytest.raises(StallError, match="the trainer waited .* for the prefetch thread") as e:
        next(it)
    assert "prepared and planned batch 0" in str(e.value)
    assert time.monotonic() - t0 < 5
    stuck.set()
    prefetch.close()
