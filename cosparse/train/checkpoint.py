"""Checkpoints: dense weights, dense optimizer, embedding rows with their optimizer state, the
vocabulary, the reader position and RNG state, written atomically (temp dir, fsync, rename).

Every file is fsynced before the rename that commits it (``dense.pt``, the tables, the metadata,
then ``LATEST``), and so are the directories. The temporary directory is
``.tmp-step_NNNNNNNN-<owner tag>`` (``cosparse.owner``): a save killed halfway leaves it, and the
next run sweeps it once its owner is gone (``sweep_checkpoints``).

A checkpoint whose rows live on the PS records the shards' snapshots and the run's ID in
``meta["ps"]`` (``{num_shards, snapshots, run_id, step, history}``, from ``before_commit``): the ID
is made at a fresh start and kept across resumes, and a resume onto PS snapshots of another run
is refused (``cosparse.supply.ps_ownership.check_run``).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosparse.durable import fsync_dir
from cosparse.owner import owner_tag, sweep

FORMAT_VERSION = 1
_LATEST = "LATEST"
TMP_PREFIX = ".tmp-step_"  # + NNNNNNNN-<owner tag>
BEST = "best"  # under a checkpoint root: train.keep_best's root, the best evaluation's checkpoint
BEST_STATE = "best.json"  # in the best root: what early stopping knew at the best evaluation


def checkpoint_roots(root: str | Path) -> list[Path]:
    """A run's checkpoint roots: ``root`` and, beneath it, the best evaluation's."""
    return [Path(root), Path(root) / BEST]


class CheckpointError(RuntimeError):
    pass


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def checkpoint_os_error(e: OSError) -> str:
    """What failed in a checkpoint's write: the error's code, its text and the path."""
    code = errno.errorcode.get(e.errno, "") if e.errno is not None else ""
    text = f"{code}: {e.strerror}" if code and e.strerror else (e.strerror or str(e))
    return f"{text} ({e.filename})" if e.filename is not None else text


def checkpoint_os_advice(e: OSError) -> str:
    """What to do about it: free space only when the disk or a quota is full."""
    if e.errno in _DISK_FULL:
        return "free disk space"
    return "fix the path or its permissions, or set train.checkpoint.dir to another directory"


@dataclass
class TrainState:
    """Where training stands: the next step to run and the reader position."""

    step: int
    epoch: int
    batch_in_epoch: int
    # data.stream: the file of the last batch trained, and its rows and batches done
    # (``cosparse.data.stream``); None for finite data
    stream: dict[str, Any] | None = None


def save_checkpoint(
    root: str | Path,
    state: TrainState,
    dense: dict[str, Any],
    tables: dict[str, dict[str, np.ndarray]],
    config: dict[str, Any],
    keep: int = 2,
    before_commit: Callable[[], dict[str, Any]] | None = None,
) -> Path:
    """Write ``root/step_NNNNNNNN`` atomically and point ``root/LATEST`` at it.

    ``before_commit`` runs once the trainer's parts are on disk and before anything is committed
    (e.g. the PS shards snapshot their rows); what it returns is recorded in the metadata. If it
    fails, nothing is committed."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{state.step:08d}"
    tmp = root / f".tmp-{final.name}-{owner_tag()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        with open(tmp / "dense.pt", "wb") as f:
            torch.save(dense, f)
            f.flush()
            os.fsync(f.fileno())
        for name, arrays in tables.items():
            with open(tmp / f"table-{name}.npz", "wb") as f:
                np.savez(f, **arrays)
                f.flush()
                os.fsync(f.fileno())
        extra = before_commit() if before_commit is not None else {}
        write_meta(tmp, {**extra, "step": state.step, "epoch": state.epoch,
                         "batch_in_epoch": state.batch_in_epoch, "stream": state.stream,
                         "tables": sorted(tables),
                         "config": config})
        commit_checkpoint(root, tmp, final, keep)
    except BaseException:  # nothing of this save is left behind (once committed, tmp is gone)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def write_meta(tmp: Path, meta: dict[str, Any]) -> None:
    """``meta.json`` (with the format version) into a checkpoint being written, fsynced, and
    the directory's entries with it."""
    with open(tmp / "meta.json", "w", encoding="utf-8") as f:
        json.dump({**meta, "format_version": FORMAT_VERSION}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(tmp)


def commit_checkpoint(root: Path, tmp: Path, final: Path, keep: int) -> None:
    """Rename the written ``tmp`` into ``final``, point LATEST at it, and keep the newest
    ``keep`` checkpoints."""
    if final.is_symlink():  # rmtree refuses links, and a rename onto one fails: say so
        raise CheckpointError(
            f"cannot write the checkpoint: {final} is a symbolic link (to {os.readlink(final)}), "
            "and a checkpoint is committed only as a real directory; nothing of it was committed "
            "(remove the link, or set train.checkpoint.dir to another directory)")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = root / f".{_LATEST}.tmp"
    with open(latest_tmp, "w", encoding="utf-8") as f:
        f.write(final.name)
        f.flush()
        os.fsync(f.fileno())
    os.replace(latest_tmp, root / _LATEST)
    fsync_dir(root)
    old = checkpoints(root)
    for p in old[: max(0, len(old) - keep)]:
        if p != final:  # (a fresh run's first save into a directory of later steps)
            shutil.rmtree(p, ignore_errors=True)


def checkpoints(root: str | Path) -> list[Path]:
    """The committed checkpoints under ``root``, oldest step first."""
    return sorted(p for p in Path(root).glob("step_*") if p.is_dir())


def sweep_checkpoints(root: str | Path) -> list[Path]:
    """Remove the temporary directories of saves whose process is gone (killed mid-save)."""
    return sweep(root, [TMP_PREFIX])


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory, or a root whose LATEST names one."""
    p = Path(path)
    if (p / "meta.json").exists():
        return p
    if (p / _LATEST).exists():
        return p / (p / _LATEST).read_text().strip()
    raise CheckpointError(f"no checkpoint at {p} (no meta.json and no {_LATEST} file)")


def read_meta(path: str | Path) -> dict[str, Any]:
    """The metadata of a checkpoint (or of the one a root's LATEST names)."""
    return json.loads((resolve_checkpoint(path) / "meta.json").read_text())


def load_checkpoint(
    path: str | Path,
) -> tuple[TrainState, dict[str, Any], dict[str, dict[str, np.ndarray]], dict[str, Any]]:
    ck = resolve_checkpoint(path)
    meta = json.loads((ck / "meta.json").read_text())
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{ck}: checkpoint format {meta.get('format_version')}, this build reads {FORMAT_VERSION}"
        )
    dense = torch.load(ck / "dense.pt", weights_only=True)
    tables = {}
    for name in meta["tables"]:
        with np.load(ck / f"table-{name}.npz") as z:
            tables[name] = {k: z[k] for k in z.files}
    state = TrainState(meta["step"], meta["epoch"], meta["batch_in_epoch"], meta.get("stream"))
    return state, dense, tables, meta["config"]


def ps_metas(root: str | Path) -> list[dict[str, Any]] | None:
    """The PS part of each committed checkpoint's metadata under ``root`` (the snapshots it
    names); None when one is unreadable (then nothing may be pruned)."""
    out = []
    for path in checkpoints(root):
        try:
            out.append(read_meta(path).get("ps") or {})
        except FileNotFoundError:  # pruned meanwhile
            continue
        except (OSError, ValueError, CheckpointError):
            return None
    return out
