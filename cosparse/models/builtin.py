"""``model.kind``: shorthand for the zoo's factory ``cosparse.models.<kind>:build``, its
arguments taken from the model section (``bottom``, ``top``; ``deep``; ``cross_layers``,
``cross_rank``; ``din.*``; ``multitask.*`` with the objective's tasks; ``dropout``). The trainer
trains the model it builds as it trains any model on the public API, behind an
``EngineModel``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from cosparse.config import Config, ConfigError
from cosparse.config.multitask import esmm_tasks
from cosparse.config.objective import objective_of
from cosparse.models import dcn, deepfm, din, dlrm, esmm, mmoe, ple, sasrec, two_tower
from cosparse.nn.embedding import EmbeddingCollection
from cosparse.nn.engine_model import EngineModel

FACTORIES: dict[str, Callable[..., nn.Module]] = {
    "dlrm": dlrm.build, "deepfm": deepfm.build, "dcn": dcn.build, "din": din.build,
    "mmoe": mmoe.build, "ple": ple.build, "esmm": esmm.build, "two_tower": two_tower.build,
    "sasrec": sasrec.build}


def builtin_args(cfg: Config) -> dict[str, Any]:
    """The factory's ``args`` of ``cfg.model`` (a multi-task model's tasks: the objective's)."""
    m = cfg.model
    t = m.multitask
    if m.kind == "mmoe":
        args: dict[str, Any] = {"tasks": list(objective_of(cfg.objective).tasks),
                                "experts": t.experts, "expert": t.expert, "tower": t.tower}
    elif m.kind == "ple":
        args = {"tasks": list(objective_of(cfg.objective).tasks), "levels": t.levels,
                "experts": t.experts, "specific": t.specific, "expert": t.expert,
                "tower": t.tower}
    elif m.kind == "esmm":
        args = {"tasks": esmm_tasks(cfg), "tower": t.tower}
    elif m.kind == "two_tower":
        tt = m.two_tower
        args = {"task": next(iter(objective_of(cfg.objective).tasks)), "tower": tt.tower,
                "user": tt.user or None, "item": tt.item or None, "logq": tt.logq}
    elif m.kind == "sasrec":
        s = m.sasrec
        args = {"task": next(iter(objective_of(cfg.objective).tasks)),
                "max_len": cfg.data.events.max_len, "layers": s.layers, "heads": s.heads,
                "inner": s.inner, "history": s.history or None, "item": s.item or None,
                "logq": s.logq}
    elif m.kind == "dlrm":
        args = {"bottom": m.bottom, "top": m.top}
    elif m.kind in ("deepfm", "dcn"):
        args = {"deep": m.deep}
        if m.kind == "dcn":
            args.update(cross_layers=m.cross_layers, cross_rank=m.cross_rank)
    else:
        args = {"pairs": m.din.pairs, "attention": m.din.attention, "mlp": m.din.mlp,
                "normalize": m.din.normalize}
    return {**args, "dropout": m.dropout}


def build_model(cfg: Config, num_dense: int, device: torch.device) -> EngineModel:
    """The model named by ``cfg.model.kind`` over the tables of ``cfg``, on ``device``, its
    initial weights drawn from torch's generator as it stands (the trainer seeds it with
    ``train.seed``); its collection placed on an embedding collection of its own (the trainer
    places it on the supply path's once it has one)."""
    kind = cfg.model.kind
    if kind is None:
        raise ConfigError("model.kind: not set, so the model is your own: train it through "
                          "cosparse.Trainer(model, config), or name a built-in model "
                          f"({', '.join(FACTORIES)})")
    objective = objective_of(cfg.objective)
    model = EngineModel(FACTORIES[kind](cfg.tables, num_dense, **builtin_args(cfg)),
                        None if objective.default else list(objective.tasks), cfg.train.seed)
    # with tiers the trainer swaps in a tiered collection once it has sized the tiers
    budget = None if cfg.store.tiered else cfg.store.device.budget_bytes
    model.ec = EmbeddingCollection(cfg.tables, device=device, budget_bytes=budget,  # type: ignore[arg-type]
                                   admit_after=cfg.store.admit_after)
    return model.to(device)
