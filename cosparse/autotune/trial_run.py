"""One trial, in its own process (``python -m cosparse.autotune.trial_run CONFIG.json``): the
engine trains the config's replay window and prints one JSON line per interval (its
throughput) and a last one with what the run cost and the digests of its losses and rows (and,
with ``--evaluate``, the held-out AUC and log loss: a semantic knob's trial).

A trial that crashes or runs out of memory takes only its own process with it; the agent
records it as an infeasible trial.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from cosparse.store.device_cache import DeviceCache


def _say(rec: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(rec) + "\n")
    sys.stdout.flush()


def row_digest(rows: dict[str, dict[str, np.ndarray]]) -> str:
    """A digest of every table's rows with their optimizer state, in ID order."""
    h = hashlib.sha256()
    for name in sorted(rows):
        ids, values = rows[name]["ids"], rows[name]["rows"]
        order = np.argsort(ids, kind="stable")
        h.update(name.encode())
        h.update(np.ascontiguousarray(ids[order]).tobytes())
        h.update(np.ascontiguousarray(values[order], dtype=np.float32).tobytes())
    return h.hexdigest()


def vocabulary(cfg: Any) -> int | None:
    """How many rows a table of this run's reader can come to hold (None: unknown)."""
    reader = cfg.data.reader
    if reader == "synthetic":
        return cfg.data.synthetic.vocab_size
    if reader == "synthetic_sequences":
        return cfg.data.events.synthetic.vocab_size
    return None


def held_bytes(trainer: Any) -> tuple[float, float]:
    """(device, host) bytes the run's tables hold: the tiers' capacities. An unbounded tier
    (the host tier of a resident path, an all-resident table) counts the rows it comes to hold
    in a long run, its vocabulary where the reader knows it, not the few a short trial saw."""
    device = host = 0.0
    plans = trainer.sizing.plans if trainer.sizing is not None else {}
    vocab = vocabulary(trainer.cfg)
    for name, t in trainer.ec.tables.items():
        plan = plans.get(name)
        if isinstance(t, DeviceCache) and trainer.cfg.supply.path == "ps-direct":
            device += t.device_bytes()[1]  # architecture A's device cache over the PS
        elif plan is not None:
            device += plan.device_rows * t.row_bytes
            rows = plan.host_rows if plan.host_rows is not None else max(t.num_rows, vocab or 0)
            host += rows * t.row_bytes
        elif trainer.cfg.supply.path == "resident":  # all-resident on the device
            device += max(t.num_rows, vocab or 0) * t.row_bytes
    return device, host


def main(path: str, evaluate: bool = False) -> int:
    from cosparse.config import config_from_mapping
    from cosparse.train.trainer import Trainer

    raw = json.loads(Path(path).read_text())
    trainer = Trainer(config_from_mapping(raw), log=lambda msg: None,
                      on_interval=lambda r: _say({"step": r["step"],
                                                  "samples_per_s": r["samples_per_s"]}))
    try:
        final = trainer.run(evaluate=evaluate)
        steps = max(1, trainer.state.step)
        ps = sum(float(final.get(k) or 0.0) for k in ("bytes.trainer_ps.pull",
                                                      "bytes.trainer_ps.push", "bytes.worker_ps"))
        device, host = held_bytes(trainer)
        losses = np.asarray(trainer.losses, dtype=np.float32)
        _say({"done": True, "device_bytes": device, "host_bytes": host,
              "ps_bytes_per_step": ps / steps,
              "loss_digest": hashlib.sha256(losses.tobytes()).hexdigest(),
              "row_digest": row_digest(trainer.ec.export_rows()),
              "auc": final.get("auc"), "logloss": final.get("logloss")})
    finally:
        trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], evaluate="--evaluate" in sys.argv[2:]))
