"""The public ``Trainer``: a model of the user's own trained by the engine on every placement,
path and rank count that the config describes, and its ``RunResult``.

It wraps the internal trainer (``cosparse.train.trainer``): the user's model goes in behind
``EngineModel`` instead of a built-in one, its ``EmbeddingBagCollection`` placed on the engine's
embedding collection, its dense rest wrapped as ``parallel.dense`` says on many ranks. Lazy
modules are materialised first (``cosparse.api.lazy``). The loss is the objective's
(``cosparse.Objective`` or the config's ``objective``; by default binary cross-entropy on the
one label).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from cosparse.api.config import config_for_model, load_config
from cosparse.api.lazy import lazy_names, materialise
from cosparse.api.objective import Objective, with_objective
from cosparse.batch import SparseBatch
from cosparse.config import Config
from cosparse.config.objective import objective_of
from cosparse.data.reader import NOT_YET, Reader
from cosparse.nn.collections import Collections
from cosparse.nn.embedding import EmbeddingCollection
from cosparse.nn.engine_model import EngineModel
from cosparse.train.dense import pick_device
from cosparse.train.inputs import ModelInputs, check_table_features, model_inputs
from cosparse.train.trainer import Trainer as EngineTrainer


@dataclass
class RunResult:
    """What ``Trainer.fit`` returns: ``metrics``, the final record flat (nested figures under
    dotted keys; the one task's scores also as ``auc.label`` and ``logloss.label``), the
    ``losses`` of the steps this fit trained, and the ``step`` it ended at."""

    metrics: dict[str, Any]
    losses: list[float] = field(default_factory=list)
    step: int = 0


class Trainer:
    """Trains ``model`` (a ``torch.nn.Module`` holding one ``cosparse.EmbeddingBagCollection``,
    whose ``forward(cosparse.Batch)`` returns logits ``Tensor[B]``) under ``config`` (a
    ``Config``, or what ``cosparse.load_config`` reads). Use as a context manager, or ``close``."""

    def __init__(self, model: nn.Module, config: Config | str | Path | Mapping[str, Any],
                 objective: Objective | None = None, *, log: Callable[[str], None] | None = None,
                 inputs: ModelInputs | None = None,
                 on_interval: Callable[[dict[str, Any]], Any] | None = None) -> None:
        """``objective``: the tasks and their losses (``cosparse.Objective``; None: the config's
        ``objective`` section, or one binary task, ``label``); ``log``: where the run's lines go
        (default: above the progress bar). ``inputs`` and ``on_interval``, as ``cosparse train``
        gives them (``cosparse.api.factory``): the readers, already made from the config, and
        what watches every interval's metrics."""
        collections = Collections(model)
        cfg = config if isinstance(config, Config) else load_config(config)
        cfg = config_for_model(with_objective(cfg, objective), collections.tables)
        self.model = model
        self.collections = collections
        if lazy_names(model):  # a dry forward on the first batch, before any optimizer sees it
            inputs = inputs or model_inputs(cfg)
            check_table_features(inputs.cfg, inputs.train)
            materialise(model, collections, _first_batch(inputs.train), cfg.train.seed)
        try:
            if cfg.store.tiered and not collections.placed:
                # what "dense first" sizing dry-runs the model on before the tiers exist: a
                # collection as a built-in model's own (the trainer then places the real one)
                collections.place(EmbeddingCollection(cfg.tables, pick_device(cfg.train.device)))
            tasks = None if objective_of(cfg.objective).default else list(cfg.objective.tasks)
            self._engine = EngineTrainer(cfg, log=log, inputs=inputs, on_interval=on_interval,
                                         model=EngineModel(model, tasks, cfg.train.seed))
        except BaseException:
            collections.place(None)  # (what the failed set-up placed it on is stopped)
            raise
        self.config = self._engine.cfg

    @property
    def engine(self) -> EngineTrainer:
        """The internal trainer (what ``cosparse train`` and the tuner's trials drive)."""
        return self._engine

    @property
    def step(self) -> int:
        return self._engine.state.step

    def fit(self, steps: int | None = None) -> RunResult:
        """Train up to ``steps`` in all (default: ``train.steps`` / ``train.epochs``), then
        evaluate; early stopping and checkpoints as the config's ``train`` section says."""
        first = len(self._engine.losses)
        final = self._engine.run(steps)
        return RunResult(_flat(_with_task_names(final)), self._engine.losses[first:],
                         self._engine.state.step)

    def evaluate(self) -> dict[str, Any]:
        """The metrics over the eval split, per task (``auc.<task>``, ``logloss.<task>``,
        ``gauc.<task>``, ``mse.<task>``, ``mae.<task>``; the one task's also as ``auc`` and
        ``logloss``); the tables are not modified."""
        return _with_task_names(self._engine.evaluate())

    def save(self, directory: str | Path) -> Path:
        """A checkpoint of the whole state (rows, dense model, optimizers, position) under
        ``directory``; returns the checkpoint's own directory."""
        return self._engine.save(str(directory))

    def resume(self, directory: str | Path) -> None:
        """Go on from the checkpoint at ``directory`` (one, or a root whose newest is taken)."""
        self._engine.resume(str(directory))

    def close(self) -> None:
        """Stop what the run started (PS shards, data workers); the collection is unplaced."""
        try:
            self._engine.close()
        finally:
            self.collections.place(None)

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _first_batch(reader: Reader) -> SparseBatch:
    """The first training batch (what lazy modules take their shapes from)."""
    tasks = reader.tasks()
    try:
        task = next(iter(tasks), None)
    finally:
        if hasattr(tasks, "close"):
            tasks.close()
    if task is None or task is NOT_YET:
        raise ValueError("the model has lazy modules, whose shapes come from the first batch, "
                         "but the training data has none yet")
    return reader.build(task)


def _with_task_names(scores: dict[str, Any]) -> dict[str, Any]:
    """``scores`` with the one task's metrics also under ``<metric>.label``."""
    return {**scores, **{f"{k}.label": scores[k] for k in ("auc", "logloss") if k in scores}}


def _flat(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``record`` with nested mappings flattened into dotted keys."""
    out: dict[str, Any] = {}
    for k, v in record.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
