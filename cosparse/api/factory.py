"""Models by name: ``model.factory: "package.module:function"`` in a config builds the user's
model as ``function(tables, num_dense, **model.args)``, and ``cosparse train`` (and a tuner's
trial) trains it through the public ``cosparse.Trainer``.

The module is found on ``sys.path``: ``PYTHONPATH``, or the folders of ``--model-path``, which
``add_model_paths`` also puts in ``COSPARSE_MODEL_PATH`` so that every process started from
this one (torchrun ranks run the same command line; tuner trials inherit the environment)
finds it the same way when it resolves the factory.
"""

from __future__ import annotations

import copy
import importlib
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cosparse.api.trainer import Trainer
from cosparse.config import Config, ConfigError
from cosparse.train.checkpoint import read_meta
from cosparse.train.inputs import check_table_features, model_inputs
from cosparse.train.trainer import Trainer as EngineTrainer

MODEL_PATH_ENV = "COSPARSE_MODEL_PATH"


def add_model_paths(paths: Iterable[str | Path]) -> None:
    """Folders where model factories' modules are imported from: first on ``sys.path``, and in
    ``COSPARSE_MODEL_PATH`` for the processes this one starts."""
    folders = [str(Path(p).resolve()) for p in paths]
    if not folders:
        return
    for folder in folders:
        if not Path(folder).is_dir():
            raise ConfigError(f"--model-path: {folder} is not a folder")
    known = [p for p in os.environ.get(MODEL_PATH_ENV, "").split(os.pathsep) if p]
    os.environ[MODEL_PATH_ENV] = os.pathsep.join(folders + [p for p in known if p not in folders])
    _put_on_sys_path()


def _put_on_sys_path() -> None:
    for folder in reversed([p for p in os.environ.get(MODEL_PATH_ENV, "").split(os.pathsep) if p]):
        if folder not in sys.path:
            sys.path.insert(0, folder)


def resolve_factory(spec: str) -> Callable[..., Any]:
    """The function ``spec`` (``package.module:function``) names; a ConfigError naming
    ``model.factory`` and why when it cannot be had."""
    _put_on_sys_path()
    module_name, _, attr = spec.partition(":")
    if not module_name.strip() or not attr.strip():
        raise ConfigError(f"model.factory: '{spec}' is not of the form 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # (ImportError, or whatever the module raised on import)
        raise ConfigError(
            f"model.factory: '{spec}': module '{module_name}' does not import "
            f"({type(e).__name__}: {e}); give its folder with --model-path or PYTHONPATH"
        ) from None
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"model.factory: '{spec}': module '{module_name}' "
                              f"({getattr(module, '__file__', '?')}) has no '{attr}'")
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(f"model.factory: '{spec}' is a {type(target).__name__}, not callable")
    return target  # type: ignore[no-any-return]


def build_factory_model(cfg: Config, num_dense: int) -> nn.Module:
    """``cfg.model.factory(tables, num_dense, **cfg.model.args)``, checked to be a module. It
    runs after ``torch.manual_seed(train.seed)``: its initial weights are those of the model
    built in Python after the same seeding, whatever the process did before."""
    m = cfg.model
    factory = resolve_factory(m.factory or "")
    torch.manual_seed(cfg.train.seed)
    model = factory(copy.deepcopy(cfg.tables), num_dense, **m.args)
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model.factory: '{m.factory}' returned a {type(model).__name__}, "
                          "not a torch.nn.Module")
    return model


class FactoryTrainer:
    """The internal trainer of a ``cosparse.Trainer`` over a factory-built model, as
    ``cosparse train`` and a tuner's trial drive it (``run``, ``resume``, ``state`` ... go to
    the internal trainer; ``close`` also unplaces the model's collection)."""

    def __init__(self, public: Trainer) -> None:
        self.public = public

    def __getattr__(self, name: str) -> Any:
        return getattr(self.public.engine, name)

    def resume(self, path: str) -> None:
        """Go on from the checkpoint at ``path``, which the same factory and args wrote."""
        check_same_factory(self.public.config, read_meta(path)["config"], path)
        self.public.resume(path)

    def close(self) -> None:
        self.public.close()


def make_trainer(cfg: Config, **options: Any) -> EngineTrainer | FactoryTrainer:
    """The trainer of a one-model config: the internal trainer over a built-in model, or over
    the model ``model.factory`` builds (behind a ``cosparse.Trainer``). ``options``: the
    internal trainer's ``log`` and ``on_interval``."""
    if cfg.model.factory is None:
        return EngineTrainer(cfg, **options)
    inputs = model_inputs(cfg)  # (the tables' features resolved, the number of dense inputs)
    check_table_features(inputs.cfg, inputs.train)
    model = build_factory_model(inputs.cfg, inputs.train.num_dense)
    return FactoryTrainer(Trainer(model, inputs.cfg, inputs=inputs, **options))


def check_same_factory(cfg: Config, saved: dict[str, Any], path: str) -> None:
    """A checkpoint resumes under the factory and args that wrote it (its meta's config)."""
    model = saved.get("model") or {}
    theirs = (model.get("factory"), model.get("args") or {})
    if theirs != (cfg.model.factory, cfg.model.args):
        raise ConfigError(
            f"model.factory: the checkpoint at {path} holds the model of factory {theirs[0]!r} "
            f"with args {theirs[1]}, this config names {cfg.model.factory!r} with args "
            f"{cfg.model.args}; resume under the config that wrote it")
