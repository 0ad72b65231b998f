"""The ``train`` section: steps, logging, checkpoints and failure handling, and its rules."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from cosparse.config.errors import ConfigError

if TYPE_CHECKING:
    from cosparse.config.root import Config


@dataclass
class CheckpointConfig:
    dir: str | None = None
    every: int = 0
    keep: int = 2
    incremental: bool = False  # PS shards snapshot only the rows written since their last one


@dataclass
class TrainConfig:
    steps: int = 1000
    epochs: int = 1  # passes over a finite reader; `steps` caps the total
    seed: int = 0
    threads: int | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    log_every: int = 50
    eval_every: int = 0  # 0: evaluate at the end only
    metrics_json: str | None = None
    tensorboard_dir: str | None = None
    progress: bool = True
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    # a step whose loss is NaN or infinite: stop the run there with an error naming the step,
    # or skip the batch's updates (sparse and dense) and count it in `skipped_batches`
    on_nonfinite: Literal["stop", "skip_batch"] = "stop"
    # a wait whose other side (trainer, planner thread, data stream) makes no progress this long
    # raises an error naming both sides instead of hanging; 0 waits without bound
    stall_timeout_s: float = 300.0
    # debug (architecture A): before each batch trains, check the version of every row it uses
    # against the PS's (a PEEK per table and step); a stale copy stops the run, naming the table,
    # an ID and both versions
    check_versions: bool = False


def validate_train(cfg: Config) -> None:
    """Periodic checkpoints have a directory."""
    ck = cfg.train.checkpoint
    if ck.every and not ck.dir:
        raise ConfigError("train.checkpoint.dir: needed when train.checkpoint.every is set")
