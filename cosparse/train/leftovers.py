"""What earlier runs left, handled when a run starts.

- ``sweep_dead_runs``: the leftovers of runs whose process is gone (``cosparse.owner``): their
  shared-memory directories, temporary run directories (embedded PS data, multiprocessing),
  half-written checkpoints and half-written PS snapshots. A live run's are never touched.
- ``earlier_snapshots`` / ``StaleSnapshots``: a run that starts at step 0 with an embedded
  ``store.remote.data_dir`` that holds an earlier run's PS snapshots is refused (its shards would
  serve the old rows); ``discard_earlier_run`` (``cosparse train --fresh``) removes them, and the
  checkpoints that name them, and says so.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from cosparse.config import Config
from cosparse.owner import sweep
from cosparse.ps import snapshots
from cosparse.ps.snapshots import StaleSnapshots
from cosparse.supply.collaborative.shared_batch import shared_base
from cosparse.train.checkpoint import CheckpointError, checkpoints, read_meta, sweep_checkpoints

RUN_PREFIX = "cosparse-"  # shared-memory and temporary directories of a run: cosparse-<kind>-<tag>-


def sweep_dead_runs(cfg: Config) -> list[Path]:
    """Remove what runs that are gone left behind; returns the paths removed."""
    removed = sweep(shared_base(), [RUN_PREFIX])
    if tempfile.gettempdir() != shared_base():
        removed += sweep(tempfile.gettempdir(), [RUN_PREFIX])
    if cfg.train.checkpoint.dir:
        removed += sweep_checkpoints(cfg.train.checkpoint.dir)
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


def discard_earlier_run(cfg: Config, log: Callable[[str], None]) -> None:
    """``--fresh``: remove the PS snapshots in the embedded data dir, and the checkpoints of
    ``train.checkpoint.dir`` that name PS snapshots (they could not be resumed without them, and
    a new run's snapshots will reuse their names); log what was removed."""
    remote = cfg.store.remote
    if not (remote.embedded and remote.data_dir):
        return
    n = snapshots.discard(remote.data_dir)
    gone = []
    ck = cfg.train.checkpoint.dir
    if ck and Path(ck).is_dir():
        for path in checkpoints(ck):
            try:
                named = "ps" in read_meta(path)
            except (OSError, ValueError, CheckpointError):  # not a readable checkpoint
                named = False
            if named:
                shutil.rmtree(path, ignore_errors=True)
                gone.append(path.name)
        latest = Path(ck) / "LATEST"
        if latest.exists() and latest.read_text().strip() in gone:
            latest.unlink()
    if n or gone:
        ck_part = f" and {len(gone)} checkpoints in {ck} that named them" if gone else ""
        log(f"--fresh: discarded {n} PS snapshots of an earlier run in {remote.data_dir}{ck_part}")
