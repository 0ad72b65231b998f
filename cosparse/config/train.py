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
    every_s: float = 0.0  # also checkpoint when this many seconds passed since the last (0: off)
    keep: int = 2
    incremental: bool = False  # PS shards snapshot only the rows written since their last one


# the exact knobs a running trainer can change between intervals (train.autotune.knobs)
LIVE_KNOBS = ("supply.lookahead", "supply.horizon", "data.workers", "data.queue_depth",
              "supply.publish_every", "store.device.rows", "store.host.rows", "supply.path")
# the supply paths a run started on 'collaborative' switches between: the same tiers over the
# same PS, with the workers' rows or with the trainer's own pulls
LIVE_PATHS = ("collaborative", "ps-tiered")


@dataclass
class AutotuneConfig:
    """The live tuning agent: it changes ``knobs`` (of ``LIVE_KNOBS``) one at a time, each
    measured over ``every`` steps against the ``every`` steps before it (none: off)."""

    knobs: list[str] = field(default_factory=list)
    every: int = 200  # steps per measured interval: a multiple of train.log_every
    journal: str | None = None  # the audit journal (default: beside metrics_json, else here)
    # the tiers' byte budgets when store.device.rows / store.host.rows are knobs
    device_budget: int | str | None = None
    host_budget: int | str | None = None
    min_gain: float = 0.03  # a change stays if it is this much faster, significantly
    # after this many changes in a row rolled back, the agent stops trying (each trial costs
    # the run its window) until throughput drifts below the settled window's; 0: no limit
    patience: int = 3


@dataclass
class EarlyStopConfig:
    """Evaluate every ``every`` steps; stop once ``metric`` has not improved for ``patience``
    evaluations in a row (AUC: higher is better; log loss: lower)."""

    # auc or logloss (the one task, label), or <metric>.<task>: auc, logloss (binary), mse, mae
    # (regression) of a task of the objective (config/objective.py checks it)
    metric: str = "auc"
    patience: int = 3
    every: int = 100


@dataclass
class TraceConfig:
    """A Chrome/Perfetto trace (JSON ``traceEvents``) of chosen steps, written to ``path`` when
    the run ends: the steps ``steps: [from, to]`` (inclusive), or the ``slowest`` N steps."""

    path: str = ""
    steps: list[int] | None = None
    slowest: int | None = None  # (10 when neither is given)


@dataclass
class HealthConfig:
    """Live health warnings, judged every interval (``cosparse.train.health``)."""

    # the device hit rate over the best achievable one for the same capacity (the bound),
    # below which a table's cache is reported as not earning its keep...
    hit_rate_floor: float = 0.8
    intervals_below: int = 3  # ...for this many intervals in a row
    bound_sample_steps: int = 200  # the recent batches of IDs the bound is computed on
    # the trainer's wait for the prefetch/planner thread, as a share of the interval's step time
    planner_wait_share: float = 0.25
    stale_drop_rate: float = 0.05  # architecture B's stale drops per delivered row


@dataclass
class CpuConfig:
    """How the run divides the host's cores (``cosparse.train.cpu_budget``)."""

    # the trainer's torch intra-op and numba threads; auto: the usable cores less the reserve
    threads: int | Literal["auto"] = "auto"
    # cores kept for the data workers and embedded PS shards; auto: one per worker and shard
    # (the trainer keeps one at least). 0, the default, leaves every core to the trainer
    reserve_for_workers: int | Literal["auto"] = 0


@dataclass
class TrainConfig:
    # the run's limits (`run_limits`): `epochs` alone trains that many passes over a finite
    # reader; `steps` alone, or neither (DEFAULT_STEPS), at most one pass; both: the first
    # reached ends the run, and the log says which
    steps: int | None = None
    epochs: int | None = None
    seed: int = 0
    threads: int | None = None  # the same as cpu.threads (set one of them)
    cpu: CpuConfig = field(default_factory=CpuConfig)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    log_every: int = 50
    eval_every: int = 0  # 0: evaluate at the end only
    # None: `cosparse train` writes runs/<time>-<config>/metrics.jsonl (a Trainer: no file)
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
    autotune: AutotuneConfig = field(default_factory=AutotuneConfig)
    early_stop: EarlyStopConfig | None = None  # None: train every step of `steps`/`epochs`
    weighted_metrics: bool = False  # eval metrics weighted by data.columns.weight (AUC: not)
    # keep a checkpoint of the best evaluation (under checkpoint.dir/best) and end the run on it
    keep_best: bool = False
    # the first steps a process trains, left out of the run summary's timing figures
    # (compilation, first fills); the summary measures every step when the run is no longer
    timing_warmup_steps: int = 10
    trace: TraceConfig | None = None  # None: no trace (the step records are always written)
    health: HealthConfig = field(default_factory=HealthConfig)
    # a multi-model run: a model that fails stops only itself (the others train on, and the run
    # reports it in failed_models); false: the first failure stops every model
    isolate_models: bool = False


DEFAULT_STEPS = 1000  # train.steps when neither train.steps nor train.epochs is given


def run_limits(train: TrainConfig) -> tuple[int | None, int]:
    """The step limit (None: none, when only ``epochs`` is given) and the epoch limit that
    ``train.steps`` and ``train.epochs`` set."""
    if train.steps is None and train.epochs is None:
        return DEFAULT_STEPS, 1
    return train.steps, train.epochs if train.epochs is not None else 1


def validate_train(cfg: Config) -> None:
    """Periodic checkpoints have a directory; keep_best has early stopping and a checkpoint
    directory; the live agent's knobs are live knobs."""
    ck = cfg.train.checkpoint
    if ck.every and not ck.dir:
        raise ConfigError("train.checkpoint.dir: needed when train.checkpoint.every is set")
    if ck.every_s and not ck.dir:
        raise ConfigError("train.checkpoint.dir: needed when train.checkpoint.every_s is set")
    if cfg.train.keep_best and cfg.train.early_stop is None:
        raise ConfigError("train.keep_best: needs train.early_stop (the evaluations that pick "
                          "the best state)")
    if cfg.train.keep_best and not ck.dir:
        raise ConfigError("train.keep_best: needs train.checkpoint.dir (the best state is kept "
                          "as a checkpoint under it)")
    cpu = cfg.train.cpu
    if cfg.train.threads is not None and cpu.threads not in ("auto", cfg.train.threads):
        raise ConfigError(f"train.threads ({cfg.train.threads}) and train.cpu.threads "
                          f"({cpu.threads}) disagree: set one of them")
    _validate_trace(cfg)
    _validate_autotune(cfg)


def _validate_trace(cfg: Config) -> None:
    tr = cfg.train.trace
    if tr is None:
        return
    if not tr.path:
        raise ConfigError("train.trace.path: the file the trace is written to is needed")
    if tr.steps is not None and tr.slowest is not None:
        raise ConfigError("train.trace: give steps: [from, to] or slowest: N, not both")
    if tr.steps is not None and (len(tr.steps) != 2 or not 1 <= tr.steps[0] <= tr.steps[1]):
        raise ConfigError(f"train.trace.steps: {tr.steps} is not [from, to] with "
                          "1 <= from <= to (steps count from 1)")


def _validate_autotune(cfg: Config) -> None:
    at, log_every = cfg.train.autotune, cfg.train.log_every
    if not at.knobs:
        return
    bad = [k for k in at.knobs if k not in LIVE_KNOBS]
    if bad:
        raise ConfigError(f"train.autotune.knobs: {', '.join(bad)} cannot change while training "
                          f"(live knobs: {', '.join(LIVE_KNOBS)}; `cosparse tune` tunes the rest)")
    if at.every < 4 * log_every or at.every % log_every:  # (3 measured after a restart)
        raise ConfigError(f"train.autotune.every: {at.every} must be a multiple of train.log_every "
                          f"({log_every}) and at least 4 of its intervals, to compare windows")
    path = cfg.supply.path
    if "supply.path" in at.knobs and path != "collaborative":
        raise ConfigError(f"train.autotune.knobs: supply.path switches a run started on "
                          f"'collaborative' to 'ps-tiered' and back, not one on '{path}' "
                          "(`cosparse tune` tries every path)")
    if "supply.publish_every" in at.knobs and path != "collaborative":
        raise ConfigError(f"train.autotune.knobs: supply.publish_every is architecture B's; "
                          f"supply.path '{path}' publishes nothing")
    if "supply.lookahead" in at.knobs and path == "ps-direct":
        raise ConfigError("train.autotune.knobs: supply.lookahead sizes architecture A's tables "
                          "when they are built; it cannot change live on supply.path 'ps-direct'")
    if "supply.horizon" in at.knobs and (path == "ps-direct" or not cfg.store.tiered):
        raise ConfigError("train.autotune.knobs: supply.horizon steers tiered tables only")
    for tier, budget in (("device", at.device_budget), ("host", at.host_budget)):
        if f"store.{tier}.rows" not in at.knobs:
            continue
        if path == "ps-direct" or getattr(cfg.store, tier).rows is None:
            raise ConfigError(f"train.autotune.knobs: store.{tier}.rows resizes a tier that "
                              f"store.{tier}.rows sizes (tiers on supply.path '{path}' with "
                              f"store.{tier}.rows set)")
        if budget is None:
            raise ConfigError(f"train.autotune.{tier}_budget: the bytes store.{tier}.rows may "
                              "grow to are needed to tune it")
