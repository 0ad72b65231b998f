"""What earlier runs left, handled when a run starts.

- ``sweep_dead_runs``: the leftovers of runs whose process is gone (``cosparse.owner``): their
  supply paths' shared-memory and temporary directories and half-written PS snapshots
  (``cosparse.supply.leftovers``), and their half-written checkpoints. A live run's are never
  touched.
- ``discard_earlier_run`` (``cosparse train --fresh``): removes an earlier run's PS snapshots in
  the embedded data dir, and the checkpoints that name them, and says so; on external shards it
  drops this run's namespace's tables (``cosparse.supply.ps_ownership``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from cosparse.config import Config
from cosparse.supply.leftovers import discard_snapshots, sweep_path_leftovers
from cosparse.supply.ps_ownership import clear_external
from cosparse.train.checkpoint import (
    BEST_STATE,
    CheckpointError,
    checkpoint_roots,
    checkpoints,
    read_meta,
    sweep_checkpoints,
)


def sweep_dead_runs(cfg: Config) -> list[Path]:
    """Remove what runs that are gone left behind; returns the paths removed."""
    removed = sweep_path_leftovers(cfg)
    if cfg.train.checkpoint.dir:
        for root in checkpoint_roots(cfg.train.checkpoint.dir):  # (the best one's too)
            removed += sweep_checkpoints(root)
    return removed


def discard_earlier_run(cfg: Config, log: Callable[[str], None]) -> None:
    """``--fresh``: remove the PS snapshots in the embedded data dir, and the checkpoints of
    ``train.checkpoint.dir`` (and its best evaluation's, ``train.keep_best``) that name PS
    snapshots (they could not be resumed without them, and a new run's snapshots will reuse
    their names); log what was removed. External shards: drop this run's namespace's tables
    there (rank 0 alone, under torchrun), and log that."""
    remote = cfg.store.remote
    if not remote.embedded and cfg.supply.path != "resident" \
            and os.environ.get("RANK", "0") == "0":
        clear_external(cfg, log)
        return
    if not (remote.embedded and remote.data_dir):
        return
    n = discard_snapshots(cfg)
    gone = []
    ck = cfg.train.checkpoint.dir
    for root in checkpoint_roots(ck) if ck else []:
        if not root.is_dir():
            continue
        named_here = []
        for path in checkpoints(root):
            try:
                named = "ps" in read_meta(path)
            except (OSError, ValueError, CheckpointError):  # not a readable checkpoint
                named = False
            if named:
                shutil.rmtree(path, ignore_errors=True)
                named_here.append(path.name)
        latest = root / "LATEST"
        if latest.exists() and latest.read_text().strip() in named_here:
            latest.unlink()
        if named_here:  # (the best's record goes with its checkpoint)
            (root / BEST_STATE).unlink(missing_ok=True)
        gone += named_here
    if n or gone:
        ck_part = f" and {len(gone)} checkpoints in {ck} that named them" if gone else ""
        log(f"--fresh: discarded {n} PS snapshots of an earlier run in {remote.data_dir}{ck_part}")
