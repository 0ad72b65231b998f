"""What the supply paths of earlier runs left: found and handled when a run starts.

- ``sweep_path_leftovers``: the shared-memory and temporary directories (embedded PS data, B's
  shared batches) and half-written PS snapshots of runs whose process is gone
  (``cosparse.owner``). A live run's are never touched.
- ``earlier_snapshots`` / ``stale_snapshots_error``: a run that starts at step 0 with an embedded
  ``store.remote.data_dir`` that holds an earlier run's PS snapshots is refused (its shards would
  serve the old rows); ``discard_snapshots`` (``cosparse train --fresh``) removes them.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from cosparse.config import Config
from cosparse.owner import sweep
from cosparse.ps import snapshots
from cosparse.ps.snapshots import StaleSnapshots
from cosparse.supply.shared_memory import shared_base

RUN_PREFIX = "cosparse-"  # shared-memory and temporary directories of a run: cosparse-<kind>-<tag>-


def sweep_path_leftovers(cfg: Config) -> list[Path]:
    """Remove what the supply paths of runs that are gone left behind; returns the paths."""
    removed = sweep(shared_base(), [RUN_PREFIX])
    if tempfile.gettempdir() != shared_base():
        removed += sweep(tempfile.gettempdir(), [RUN_PREFIX])
    remote = cfg.store.remote
    if remote.embedded and remote.data_dir:
        for root in snapshots.shard_roots(remote.data_dir):
            removed += sweep(root / "snapshots", [".tmp-"])
    return removed


def earlier_snapshots(cfg: Config) -> dict[str, str]:
    """The newest snapshot of each shard in the embedded ``store.remote.data_dir`` (empty: none,
    or no durable embedded shards)."""
    remote = cfg.store.remote
    if not (remote.embedded and remote.data_dir):
        return {}
    return snapshots.held(remote.data_dir)


def stale_snapshots_error(cfg: Config, held: dict[str, str]) -> StaleSnapshots:
    """The refusal of a run that would start at step 0 on ``held`` snapshots."""
    where = ", ".join(f"{k}: {v}" for k, v in sorted(held.items()))
    ck = cfg.train.checkpoint.dir
    resume = f"--resume {ck}" if ck and (Path(ck) / "LATEST").exists() else "--resume CHECKPOINT_DIR"
    return StaleSnapshots(
        f"store.remote.data_dir {cfg.store.remote.data_dir} holds the PS snapshots of an earlier "
        f"run ({where}); this run does not resume that run, and its shards would train on those "
        "rows. "
        f"Go on with that run: `cosparse train {resume}`; or start over: `cosparse train "
        "--fresh` (discards those snapshots and the checkpoints that name them)")


def discard_snapshots(cfg: Config) -> int:
    """Remove the PS snapshots in the embedded data dir; returns how many."""
    remote = cfg.store.remote
    if not (remote.embedded and remote.data_dir):
        return 0
    return snapshots.discard(remote.data_dir)
