"""The tuning agents' measured windows hold only steps after the warm-up, under one setting:
the offline agent's trial intervals folded into windows past the warm-up (the trial's own
intervals: ``tests/test_autotune.py``), and the live agent's window after a change starting
after the change's restart."""

from __future__ import annotations

import copy

from test_autotune_live import POOR, _rec

from cosparse.autotune.live import LiveAgent
from cosparse.autotune.measure import WindowFolder
from cosparse.autotune.types import Window
from cosparse.config import config_from_mapping


def test_a_window_starts_after_the_warm_up():
    """--warmup 5 --window-steps 12: the trial logs every gcd(5, 12) = 1 steps, and the first
    window is steps 6-17, not 1-12 (whose first five are the warm-up's)."""
    window = Window(warmup_steps=5, windows=2, window_steps=12)
    train = window.config({})["train"]
    assert train["steps"] == 29 and train["log_every"] == 1
    folder = WindowFolder(5, 12)
    # a slow warm-up (100 samples/s), then 1,000 and 2,000 samples/s
    sps = [100.0] * 5 + [1000.0] * 12 + [2000.0] * 12
    done = [w for step in range(1, 30) if (w := folder.add(step, sps[step - 1])) is not None]
    assert [(first, last) for first, last, _ in done] == [(6, 17), (18, 29)]
    assert [round(v) for *_, v in done] == [1000, 2000]


def test_a_window_is_its_intervals_samples_over_their_time():
    """Intervals of 4 steps in windows of 8 after a warm-up of 4: 4 steps at 1,000 samples/s
    and 4 at 3,000 are 8 steps in 4/1000 + 4/3000 s of a sample each: 1,500 samples/s."""
    folder = WindowFolder(4, 8)
    assert folder.add(4, 10.0) is None and folder.add(8, 1000.0) is None
    assert folder.add(12, 3000.0) == (5, 12, 1500.0)


def test_the_live_window_after_a_change_starts_after_its_restart(tmp_path):
    """A change answered at step 16 applies before step 17; the interval of steps 17-18 (the
    restart) is not measured, so the window judging it is steps 19-24, and the window before
    it steps 9-16."""
    raw = copy.deepcopy(POOR)
    raw["train"]["autotune"] = {"knobs": ["supply.lookahead"], "every": 8}
    agent = LiveAgent(config_from_mapping(raw), tmp_path / "j.log", log=print)
    answers = [agent(_rec(step, 100.0 if step <= 18 else 200.0)) for step in range(2, 26, 2)]
    assert answers[7] is not None and answers[7].changes == {"supply.lookahead": 1}  # step 16
    (change,) = agent.changes
    assert change["step"] == 24 and change["kept"]
    assert change["base_span"] == [9, 16] and change["span"] == [19, 24]
    assert change["windows"] == [200.0] * 3
