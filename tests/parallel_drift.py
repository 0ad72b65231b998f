"""How far 2 gloo ranks' losses drift from one process's over a run of the demo (its
``configs/demo_resident.yaml``, one row-wise table, the dense model training): the largest
relative loss difference up to each step. README's "Many ranks" states the figures and the
bound; ``tests/test_parallel_drift.py`` asserts the bound. Measure with

    PYTHONPATH=. python -m tests.parallel_drift --steps 100
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
STEPS_SHOWN = (10, 25, 50, 100)


def demo(steps: int, sharding: str = "row_wise", dense_lr: float = 0.05) -> dict:
    """The demo (resident rows) for ``steps`` steps, its one table sharded as ``sharding``."""
    cfg = yaml.safe_load((ROOT / "configs/demo_resident.yaml").read_text())
    cfg["data"]["workers"] = 0
    cfg["model"]["dense_optimizer"]["lr"] = dense_lr
    cfg["train"] = {"steps": steps, "log_every": steps, "progress": False, "threads": 1}
    cfg["parallel"] = {"sharding": {"cat": sharding}}
    return cfg


def drift(losses: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """The largest relative loss difference up to each step."""
    return np.maximum.accumulate(np.abs(losses - reference) / np.abs(reference))


def measure(steps: int, tmp: Path, timeout_s: float, **kind: object) -> np.ndarray:
    """The demo on 2 gloo ranks (one torchrun) and on one process: ``drift`` per step."""
    from tests.test_parallel import _merged, _one_process, _torchrun

    cfg = demo(steps, **kind)  # type: ignore[arg-type]
    _torchrun(2, [{"name": "drift", "config": cfg}], tmp, timeout_s)
    got = _merged("drift", tmp, cfg)
    return drift(np.asarray(got["losses"], dtype=np.float64),
                 np.asarray(_one_process(cfg)["losses"], dtype=np.float64))


def stated_bounds(readme: Path = ROOT / "README.md") -> dict[int, float]:
    """README's bound per step, from the "Many ranks" section's drift table: its ``| steps |``
    row and its ``| bound ...|`` row (a dash: no bound at that step)."""
    section = readme.read_text().split("## Many ranks", 1)[-1].split("\n## ", 1)[0]
    cells = [[c.strip() for c in line.strip().split("|")[1:-1]]
             for line in section.splitlines() if line.strip().startswith("|")]
    rows = {c[0]: c[1:] for c in cells if c}
    bound = next((v for k, v in rows.items() if k.startswith("bound")), None)
    if "steps" not in rows or bound is None:
        raise AssertionError("README's 'Many ranks' has no drift table (| steps | and | bound |)")
    return {int(s): float(b) for s, b in zip(rows["steps"], bound, strict=True)
            if re.fullmatch(r"[0-9.]+(e[+-]?[0-9]+)?", b)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--sharding", default="row_wise")
    ap.add_argument("--dense-lr", type=float, default=0.05)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        got = measure(args.steps, Path(tmp), 60 + 3 * args.steps, sharding=args.sharding,
                      dense_lr=args.dense_lr)
    past = np.flatnonzero(got > 1e-6)
    print(" ".join(f"step {s}: {got[s - 1]:.2g}" for s in STEPS_SHOWN if s <= args.steps))
    print(f"first past 1e-6 at step {past[0] + 1}" if past.size else "never past 1e-6")


if __name__ == "__main__":
    main()
