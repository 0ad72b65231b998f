"""One trial, in its own process (``python -m cosparse.autotune.trial_run CONFIG.json``): the
engine trains the config's replay window and prints one JSON line per interval (its
throughput) and a last one with what the run cost and the digests of its losses and rows (and,
with ``--evaluate``, the held-out AUC and log loss, and each binary task's: a semantic knob's
trial).

Under torchrun (a reordering knob's trial: several ranks), rank 0 speaks for the run: the
ranks' shards are merged into whole tables, device bytes are the largest rank's and host bytes
their sum (one host). ``--numbers PATH`` also writes the losses and whole rows (``.npz``), for
a comparison within a tolerance instead of digests.

A trial that crashes or runs out of memory takes only its own process with it; the agent
records it as an infeasible trial.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed as dist

from cosparse.autotune.types import task_metric
from cosparse.parallel.reshard import merge_shards
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
    sharding = trainer.ranks.plan if trainer.ranks is not None else None
    whole = vocabulary(trainer.cfg)
    for name, t in getattr(trainer.ec, "inner", trainer.ec).tables.items():
        s = sharding.tables.get(name) if sharding is not None else None
        # a shard hashed over its owners comes to hold its share of the vocabulary
        vocab = whole // len(s.owners) if whole and s is not None and s.route == "hash" \
            else whole
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


def whole_rows(trainer: Any) -> dict[str, dict[str, np.ndarray]] | None:
    """Every table's rows: this process's, or on rank 0 of several the ranks' shards merged
    (None on the other ranks)."""
    inner = getattr(trainer.ec, "inner", trainer.ec)
    mine = inner.export_rows()
    if trainer.ranks is None:
        return mine
    world = trainer.ranks.world
    parts: list[Any] = [None] * world.size
    dist.all_gather_object(parts, mine)
    plan = trainer.ranks.plan
    if world.rank != 0:
        return None
    if plan is None:  # architecture A: every rank reads the same rows from the shared PS
        return parts[0]
    return {t.name: merge_shards(t, plan.tables[t.name],
                                 [parts[o][t.name] for o in plan.tables[t.name].owners])
            for t in trainer.cfg.tables}


def _held(trainer: Any) -> tuple[float, float]:
    device, host = held_bytes(trainer)
    if trainer.ranks is None:
        return device, host
    every: list[Any] = [None] * trainer.ranks.world.size
    dist.all_gather_object(every, (device, host))
    return max(d for d, _ in every), sum(h for _, h in every)


def save_numbers(path: Path, losses: np.ndarray, rows: dict[str, dict[str, np.ndarray]]) -> None:
    arrays = {"losses": losses}
    for name, t in rows.items():
        order = np.argsort(t["ids"], kind="stable")
        arrays[f"ids/{name}"] = t["ids"][order]
        arrays[f"rows/{name}"] = t["rows"][order]
    np.savez(path, **arrays)


def main(path: str, evaluate: bool = False, numbers: Path | None = None) -> int:
    from cosparse.api.factory import make_trainer
    from cosparse.config import config_from_mapping

    raw = json.loads(Path(path).read_text())
    speaks = int(os.environ.get("RANK", "0")) == 0
    # (model.factory's module: found through COSPARSE_MODEL_PATH, inherited from the tuner)
    trainer = make_trainer(config_from_mapping(raw), log=lambda msg: None,
                      on_interval=lambda r: _say({"step": r["step"],
                                                  "samples_per_s": r["samples_per_s"]})
                      if speaks else None)
    try:
        final = trainer.run(evaluate=evaluate)
        steps = max(1, trainer.state.step)
        ps = sum(float(final.get(k) or 0.0) for k in ("bytes.trainer_ps.pull",
                                                      "bytes.trainer_ps.push", "bytes.worker_ps"))
        device, host = _held(trainer)
        rows = whole_rows(trainer)
        losses = np.asarray(trainer.losses, dtype=np.float32)
        if rows is not None:
            if numbers is not None:
                save_numbers(numbers, losses, rows)
            _say({"done": True, "device_bytes": device, "host_bytes": host,
                  "ps_bytes_per_step": ps / steps,
                  "loss_digest": hashlib.sha256(losses.tobytes()).hexdigest(),
                  "row_digest": row_digest(rows),
                  "auc": final.get("auc"), "logloss": final.get("logloss"),
                  "aucs": task_metric(final, "auc"),
                  "loglosses": task_metric(final, "logloss")})
        if trainer.ranks is not None:
            dist.barrier()  # rank 0's PS shards stay up until every rank has read its rows
    finally:
        trainer.close()
    return 0


if __name__ == "__main__":
    args = sys.argv[2:]
    sys.exit(main(sys.argv[1], evaluate="--evaluate" in args,
                  numbers=Path(args[args.index("--numbers") + 1]) if "--numbers" in args
                  else None))
