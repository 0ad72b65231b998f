"""The multi-task models' test data and configs (``tests/test_multitask_models.py`` and its
2-rank runner ``tests/multitask_ranks.py``): an impression log whose click and buy (which implies
the click) follow its features, and a config of each kind over it."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np

from cosparse.models import esmm, mmoe, ple

STEPS = 6
BUILD = {"mmoe": mmoe.build, "ple": ple.build, "esmm": esmm.build}
SECTIONS = {"mmoe": {"experts": 3, "expert": [8, 4], "tower": [4]},
            "ple": {"experts": 2, "specific": 1, "levels": 2, "expert": [8, 4], "tower": [4]},
            "esmm": {"tasks": ["click", "buy"], "tower": [8]}}
ARGS = {"mmoe": {"tasks": ["click", "buy"], "experts": 3, "expert": [8, 4], "tower": [4]},
        "ple": {"tasks": ["click", "buy"], "levels": 2, "experts": 2, "specific": 1,
                "expert": [8, 4], "tower": [4]},
        "esmm": {"tasks": ["click", "buy"], "tower": [8]}}


def write_log(path: Path) -> Path:
    """600 impressions: a click more likely for some users and items, a buy (which implies the
    click) more likely for some items and one dense input."""
    rng = np.random.default_rng(5)
    n = 600
    user, item = rng.integers(0, 60, n), rng.integers(0, 200, n)
    d1 = rng.normal(size=n).round(3)
    click = rng.random(n) < 0.2 + 0.5 * (item % 3 == 0) + 0.2 * (user % 2 == 0)
    buy = click & (rng.random(n) < 0.1 + 0.6 * (item % 5 == 0) + 0.1 * (d1 > 0))
    lines = ["user,item,d1,click,buy"] + [
        f"{user[i]},{item[i]},{d1[i]},{int(click[i])},{int(buy[i])}" for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def mapping(csv: Path, kind: str | None, steps: int = STEPS) -> dict:
    raw = {
        "data": {"reader": "csv", "path": str(csv), "batch_size": 32, "workers": 0,
                 "eval_fraction": 0.2,
                 "columns": {"labels": {"click": "click", "buy": "buy"}, "dense": ["d1"],
                             "sparse": ["user", "item"]}},
        "objective": {"tasks": {"click": {"kind": "binary"}, "buy": {"kind": "binary"}}},
        "model": {"dense_optimizer": {"kind": "adam", "lr": 0.01}},
        "tables": [{"name": "ids", "dim": 4, "features": ["user", "item"],
                    "optimizer": {"kind": "rowwise_adagrad", "lr": 0.05}}],
        "train": {"steps": steps, "log_every": steps, "progress": False, "threads": 1},
        "supply": {"lookahead": 1},
    }
    if kind is not None:
        raw["model"].update(kind=kind, multitask=copy.deepcopy(SECTIONS[kind]))
    return raw
