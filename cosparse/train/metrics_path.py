"""Where ``cosparse train`` writes its metrics (JSON lines, one record a line).

- ``train.metrics_json`` (or ``--metrics-json``) names the file. A fresh run refuses a file that
  already holds an earlier run's lines unless told to ``--append``; a ``--resume`` appends.
- Without one, a fresh run writes ``runs/<YYYYmmdd-HHMMSS>-<config name>/metrics.jsonl`` under
  the working directory, a directory of its own (``-2``, ``-3`` ... when that one is taken), as
  TensorBoard and Lightning users expect a run's logs; a resumed run appends to the file the
  run it continues wrote (its checkpoint's config records the path).

A multi-model run writes one file per model (``metrics.<model>.jsonl``: ``model_config``).
The library's ``Trainer`` writes no file unless ``train.metrics_json`` is set.
"""

from __future__ import annotations

import time
from pathlib import Path

from cosparse.config import Config, ConfigError, model_config
from cosparse.train.checkpoint import CheckpointError, read_meta

RUNS_ROOT = "runs"
FILE_NAME = "metrics.jsonl"


def model_files(cfg: Config) -> list[Path]:
    """The metrics files the run writes: its own, or each model's."""
    if cfg.train.metrics_json is None:
        return []
    if not cfg.models:
        return [Path(cfg.train.metrics_json)]
    return [Path(model_config(cfg, i).train.metrics_json or "") for i in range(len(cfg.models))]


def fresh_run_dir(config_path: str | Path, root: str | Path = RUNS_ROOT) -> Path:
    """A new directory ``root/<local time>-<config name>`` (suffixed until it is new)."""
    base = f"{time.strftime('%Y%m%d-%H%M%S')}-{Path(config_path).stem}"
    root = Path(root).resolve()  # (a checkpoint records it: a resume from elsewhere finds it)
    root.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        path = root / (base if n == 1 else f"{base}-{n}")
        try:
            path.mkdir()  # (exist_ok=False: two runs started in the same second get two)
            return path
        except FileExistsError:
            continue
    raise ConfigError(f"train.metrics_json: no free run directory {root}/{base}-N")


def recorded_path(cfg: Config, resume: str) -> str | None:
    """The metrics path the checkpoint being resumed recorded (a multi-model run's base
    path, from its first model's checkpoint), or None."""
    ck = Path(resume) / cfg.models[0].name if cfg.models else Path(resume)
    try:
        path = read_meta(ck).get("config", {}).get("train", {}).get("metrics_json")
    except (OSError, ValueError, CheckpointError):
        return None  # (resuming reports an unreadable checkpoint itself)
    if path is None or not cfg.models:
        return path
    p, own = Path(path), f".{cfg.models[0].name}"
    return str(p.with_name(p.stem.removesuffix(own) + p.suffix))


def choose_metrics_path(cfg: Config, config_path: str | Path, resume: str | None,
                        append: bool) -> str:
    """The metrics path of a ``cosparse train`` run (see the module doc); refuses, naming the
    key, an explicit file that holds an earlier run's lines when the run is fresh and
    ``append`` is False."""
    explicit = cfg.train.metrics_json
    if explicit is None:
        earlier = recorded_path(cfg, resume) if resume else None
        return earlier or str(fresh_run_dir(config_path) / FILE_NAME)
    if resume or append:
        return explicit
    for f in model_files(cfg):
        if f.is_file() and f.stat().st_size > 0:
            with open(f, "rb") as fh:
                lines = sum(1 for _ in fh)
            raise ConfigError(
                f"train.metrics_json: {f} already holds {lines} lines of an earlier run; a "
                "fresh run does not mix its metrics into them: give another path (or none, for "
                f"a new {RUNS_ROOT}/<time>-<config>/ directory), remove the file, pass --append "
                "to add this run to it, or --resume to continue that run")
    return explicit
