"""``cosparse.check``: the exactness harness of the tests, for any model. It trains the model
from the same initial weights on the all-resident engine and on every placement that promises
the same bits (``cosparse.train.placements``), plus a save mid-run and a resume, and measures
how far each is from the resident run in loss, rows and dense parameters."""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cosparse.api.config import config_for_model, load_config
from cosparse.api.trainer import Trainer
from cosparse.config import Config, ConfigError
from cosparse.nn.collections import Collections
from cosparse.train.exactness import Distance, Outcome, distance, sorted_rows
from cosparse.train.placements import CHECKED, placement_configs

ModelSource = nn.Module | Callable[[], nn.Module] | None


@dataclass
class CheckResult:
    """What ``check`` found: the ``distances`` of each placement from the resident run, over
    ``steps`` steps. ``ok``: every placement bit-identical (all of them promise it).
    ``notes``: the placements whose tiers moved no row (the run touches too few rows to fill
    them, so the check proved less there)."""

    steps: int
    distances: dict[str, Distance]
    notes: list[str]

    @property
    def ok(self) -> bool:
        return all(d.identical for d in self.distances.values())

    def table(self) -> str:
        """One line per placement: the largest difference in loss, rows and dense parameters."""
        lines = [f"{'placement':<14} {'loss':>10} {'rows':>10} {'dense':>10}  bit-identical"]
        for name, d in self.distances.items():
            verdict = "yes" if d.identical else f"NO: {d.first}"
            lines.append(f"{name:<14} {d.loss:>10.3g} {d.rows:>10.3g} {d.dense:>10.3g}  "
                         f"{verdict}")
        return "\n".join(lines + [f"note: {n}" for n in self.notes])


def check(model: ModelSource, config: Config | str | Path | Mapping[str, Any],
          steps: int | None = None, placements: tuple[str, ...] = CHECKED,
          log: Callable[[str], None] = print) -> CheckResult:
    """Train ``model`` for ``steps`` steps (default ``train.steps``) under ``config`` on the
    all-resident engine and on each of ``placements`` (``tiered``, ``spill``, ``ps-direct``,
    ``collaborative``, ``resume``), and compare each with the resident run.

    ``model``: a zero-argument builder of a fresh model holding a ``cosparse.EmbeddingBagCollection``
    (called once per run, under ``torch.manual_seed(train.seed)``), a model not yet trained (each
    run trains a deep copy), or None for the config's built-in ``model.kind``."""
    unknown = [p for p in placements if p not in CHECKED]
    if unknown:
        raise ConfigError(f"placements: {unknown} are not of {list(CHECKED)}")
    builder = _builder(model)
    cfg = _config(builder, config)
    steps = cfg.train.steps if steps is None else steps
    if steps < 2:
        raise ConfigError(f"--steps: {steps}; the check needs at least 2 (it resumes mid-run)")
    _quiet(cfg, steps)
    configs = placement_configs(cfg, steps)
    with tempfile.TemporaryDirectory(prefix="cosparse-check-") as tmp:
        log(f"check: resident, {steps} steps")
        ref = _train(builder, configs["resident"], steps)
        distances, notes = {}, []
        for name in placements:
            log(f"check: {name}")
            resume_at = steps // 2 if name == "resume" else None
            got = _train(builder, configs[name], steps, resume_at, Path(tmp) / name)
            distances[name] = distance(got, ref)
            if name in _EVICTS and not got.evictions:
                notes.append(f"{name}: the device tier evicted no row")
            if name in _SPILLS and not got.spilled_bytes:
                notes.append(f"{name}: the host tier sent no row down to the PS")
    return CheckResult(steps, distances, notes)


_EVICTS = ("tiered", "spill", "collaborative", "resume")  # (ps-direct has no device tier here)
_SPILLS = ("spill",)


def _builder(model: ModelSource) -> Callable[[], nn.Module] | None:
    if model is None:
        return None
    if isinstance(model, nn.Module):
        if Collections(model).placed:
            raise ConfigError("check: the model given has been trained (its "
                              "EmbeddingBagCollection is placed); give a builder of fresh "
                              "models, or one not yet trained")
        original = model
        return lambda: copy.deepcopy(original)
    if not callable(model):
        raise TypeError(f"check: model must be a torch.nn.Module, a zero-argument builder of "
                        f"one, or None (the config's model.kind); got {type(model).__name__}")
    return model


def _config(builder: Callable[[], nn.Module] | None,
            config: Config | str | Path | Mapping[str, Any]) -> Config:
    if builder is None:
        if isinstance(config, Config):
            cfg = copy.deepcopy(config)
        elif isinstance(config, Mapping):
            from cosparse.config import config_from_mapping

            cfg = config_from_mapping(copy.deepcopy(dict(config)))
        else:
            from cosparse.config import load_config as load_builtin

            cfg = load_builtin(str(config))
        if cfg.model.kind is None:
            raise ConfigError("model.kind: the config names no built-in model; check a model of "
                              "your own in Python: cosparse.check(build_model, config)")
        return cfg
    cfg = config if isinstance(config, Config) else load_config(config)
    return config_for_model(cfg, Collections(builder()).tables)


def _quiet(cfg: Config, steps: int) -> None:
    """``cfg`` set, in place, to train ``steps`` steps and leave nothing behind."""
    cfg.train.steps = steps
    cfg.train.log_every = steps
    cfg.train.progress = False
    cfg.train.eval_every = 0
    cfg.train.metrics_json = None
    cfg.train.tensorboard_dir = None
    cfg.train.checkpoint.dir = None
    cfg.train.checkpoint.every = 0
    cfg.train.checkpoint.every_s = 0.0
    cfg.train.early_stop = None
    cfg.train.keep_best = False


class _Run:
    """One trainer of the check: the engine's on a built-in model, or the public one on a
    fresh model from the builder."""

    def __init__(self, builder: Callable[[], nn.Module] | None, cfg: Config) -> None:
        self._public: Trainer | None = None
        if builder is None:
            from cosparse.train.trainer import Trainer as EngineTrainer

            self.engine = EngineTrainer(cfg, log=lambda m: None)
            self.model: nn.Module = self.engine.model
        else:
            torch.manual_seed(cfg.train.seed)
            self.model = builder()
            self._public = Trainer(self.model, cfg, log=lambda m: None)
            self.engine = self._public._engine

    def resume(self, directory: Path) -> None:
        (self._public or self.engine).resume(str(directory))

    def close(self) -> None:
        (self._public or self.engine).close()


def _train(builder: Callable[[], nn.Module] | None, cfg: Config, steps: int,
           resume_at: int | None = None, ckpt: Path | None = None) -> Outcome:
    """The outcome of ``steps`` steps under ``cfg``; with ``resume_at``, saved there into
    ``ckpt``, then resumed by a new trainer on a fresh model."""
    losses: list[float] = []
    if resume_at is not None:
        first = _Run(builder, cfg)
        try:
            first.engine.run(steps=resume_at, evaluate=False)
            saved = first.engine.save(str(ckpt))
            losses += first.engine.losses
        finally:
            first.close()
    run = _Run(builder, cfg)
    try:
        if resume_at is not None:
            run.resume(saved)
        run.engine.run(steps=steps, evaluate=False)
        losses += run.engine.losses
        rows = sorted_rows(run.engine.ec.export_rows())
        dense = {k: v.detach().cpu().clone() for k, v in run.model.state_dict().items()}
        counters = run.engine.ec.counters().values()
    finally:
        run.close()
    return Outcome(losses, rows, dense, sum(c.evictions_device for c in counters),
                   sum(c.bytes_host_backing for c in counters))
