"""``validate``: every numeric value in its range (``bounds.py``), then each section's rules, in
order. Raises ``ConfigError`` naming the dotted key."""

from __future__ import annotations

from cosparse.config.bounds import first_violation
from cosparse.config.data import validate_data
from cosparse.config.errors import ConfigError
from cosparse.config.model import validate_model
from cosparse.config.models import model_config, validate_models
from cosparse.config.multitask import MULTITASK_KINDS
from cosparse.config.objective import objective_of, validate_metric, validate_objective
from cosparse.config.parallel import validate_parallel
from cosparse.config.retrieval import (
    RETRIEVAL_KINDS,
    check_uniform_negatives,
    default_retrieval_objective,
)
from cosparse.config.root import Config
from cosparse.config.sequence import unpool_for_sequences
from cosparse.config.store import validate_remote, validate_store
from cosparse.config.supply import validate_supply
from cosparse.config.tables import validate_tables
from cosparse.config.train import DEFAULT_STEPS, validate_train

# the rules of one model's run, in the order they are checked (validate_supply relies on the
# tiers validate_store has read, validate_remote on the path validate_supply has accepted)
_MODEL_RULES = (validate_tables, validate_train, validate_store, validate_supply,
                validate_remote, validate_model, validate_parallel)


def validate(cfg: Config, tables_later: bool = False) -> Config:
    """Range and cross-field checks. Raises ConfigError naming the offending key.
    ``tables_later``: a config without tables passes (``cosparse.load_config``: the model's
    EmbeddingBagCollection brings them, and the trainer validates the whole again)."""
    violation = first_violation(cfg)
    if violation is not None:
        raise ConfigError(violation)
    validate_data(cfg)
    default_retrieval_objective(cfg)
    unpool_for_sequences(cfg)
    check_uniform_negatives(cfg)
    cols = cfg.data.columns
    if not (tables_later and cfg.objective is None):  # (cosparse.Trainer's objective= may come)
        validate_objective(cfg.objective, list(cols.labels) if cols is not None else None)
    if cfg.train.early_stop is not None:
        validate_metric(cfg.train.early_stop.metric, cfg.objective)
    if cols is not None and (cols.labels or cols.weight) and (cfg.features.spec or cfg.models):
        raise ConfigError("data.columns.labels: several tasks' labels and data.columns.weight are "
                          "read without a feature spec (features.spec) and for one model "
                          "(no models:)")
    tasks = objective_of(cfg.objective).tasks
    one_task = cfg.models or (cfg.model.kind is not None
                              and cfg.model.kind not in (*MULTITASK_KINDS, *RETRIEVAL_KINDS))
    if one_task and list(tasks) != ["label"]:
        raise ConfigError(f"objective.tasks: model.kind '{cfg.model.kind}' trains one task, "
                          f"named label; got {sorted(tasks)} (several tasks: model.kind "
                          f"{', '.join(MULTITASK_KINDS)}, or a model of your own through "
                          "cosparse.Trainer)")
    if cfg.data.stream is not None and not objective_of(cfg.objective).default:
        raise ConfigError("objective: a data.stream run's progressive validation scores one "
                          "binary task, label; several tasks train on files (data.path)")
    if cfg.train.steps is None and cfg.train.epochs is None:  # (for whoever reads train.steps;
        cfg.train.steps = DEFAULT_STEPS                       # a multi-model run's too)
    if not cfg.models:
        if cfg.train.isolate_models:
            raise ConfigError("train.isolate_models: isolates the models of a multi-model run "
                              "(models:); this config trains one model")
        _validate_one(cfg, tables_later and not cfg.tables)
        return cfg
    validate_models(cfg)
    for i in range(len(cfg.models)):
        try:
            _validate_one(model_config(cfg, i))
        except ConfigError as err:
            text = str(err)
            if text.startswith(("tables", "model")):
                text = f"models[{i}].{text}"
            raise ConfigError(text) from None
    return cfg


def _validate_one(cfg: Config, no_tables_yet: bool = False) -> None:
    for rule in _MODEL_RULES:
        if not (no_tables_yet and rule is validate_tables):
            rule(cfg)
