"""The dense model beside an export's rows: ``dense/state_dict.pt`` (the checkpoint's dense
``state_dict``, the optimizer left out) and the manifest's ``dense`` entry, which names how to
rebuild the model around it:

    "dense": {"form": "state_dict", "file": {"path", "sha256"},
              "model": {"kind": "dlrm"} | {"factory": "pkg.mod:fn", "args": {...}},
              "config": <the checkpoint's config>, "program": null, "why": "<text>"}

``program`` names a ``torch.export`` program of the dense part where the model exports, the
embedding lookup outside it (``cosparse.serving.program``): a built-in ``model.kind`` of the zoo
or a ``model.factory`` model, taking the dense inputs, each pooled feature's rows and each
``pooling: none`` feature's rows and offsets (``inputs``: the number of dense inputs, the pooled
and the jagged features in order) and returning each task's outputs. Exports written before
the zoo moved onto the public API hold a built-in model's pooled-only program (``inputs``
without ``jagged``), which the predictor still runs. Otherwise ``program`` is null and ``why``
says why:
a reader rebuilds the model from ``model`` and ``config`` (the built-in ``model.kind`` through
the zoo, a ``model.factory`` by importing it, as training did) and loads the state_dict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from cosparse.serving.format import sha256_file
from cosparse.serving.item_index import is_retrieval
from cosparse.serving.program import PROGRAM_FILE

DENSE_DIR = "dense"
STATE_FILE = "state_dict.pt"
WHY_FALLBACK = ("served from its state_dict, rebuilt through the model's reference and the "
                "checkpoint's config")


def model_reference(config: dict[str, Any]) -> dict[str, Any] | None:
    """How to build the checkpoint's model: its built-in ``kind``, or ``factory`` and ``args``;
    None for a model given in Python without a factory (nothing names how to rebuild it)."""
    model = config.get("model") or {}
    if model.get("factory"):
        return {"factory": model["factory"], "args": model.get("args") or {}}
    if model.get("kind"):
        return {"kind": model["kind"]}
    return None


def write_dense(ck: Path, meta: dict[str, Any], out: Path) -> dict[str, Any]:
    """Write checkpoint ``ck``'s dense state into ``out/dense/``; the manifest's entry."""
    src = ck / "dense.pt"
    if not src.exists():  # (a many-rank checkpoint keeps its dense state elsewhere)
        return {"form": None, "model": None, "program": None,
                "why": f"{ck} holds no dense.pt: only the rows are exported"}
    reference = model_reference(meta["config"])
    dense = torch.load(src, weights_only=True)
    (out / DENSE_DIR).mkdir()
    dst = out / DENSE_DIR / STATE_FILE
    torch.save(dense["model"], dst)
    entry: dict[str, Any] = {
        "form": "state_dict",
        "file": {"path": f"{DENSE_DIR}/{STATE_FILE}", "sha256": sha256_file(dst)},
        "model": reference, "config": meta["config"], "program": None, "why": None}
    if reference is None:
        entry["why"] = ("no torch.export program and no model to rebuild: the config names no "
                        "model.kind or model.factory (a model given in Python); name its "
                        "factory in model.factory to serve it")
    elif is_retrieval(meta["config"]):
        entry["why"] = ("a retrieval model serves top-k through its towers and the item index "
                        f"(retrieval/), not a program; {WHY_FALLBACK}")
    else:
        try:
            entry.update(export_program(meta["config"], dense["model"], out))
        except Exception as e:  # (whatever torch.export or the model raised: the fallback)
            entry["why"] = (f"torch.export failed ({type(e).__name__}: {e}); {WHY_FALLBACK}")
    return entry


def export_program(config: dict[str, Any], state: dict[str, Any], out: Path) -> dict[str, Any]:
    """Write the ``torch.export`` program of the checkpoint's model (a built-in ``model.kind``
    of the zoo, or a ``model.factory`` model) into ``out/dense/``: the entry's ``program`` and
    ``inputs`` (``cosparse.serving.program``)."""
    from cosparse.api.factory import build_factory_model
    from cosparse.config import config_from_mapping
    from cosparse.config.objective import objective_of
    from cosparse.models.builtin import build_model
    from cosparse.nn.engine_model import EngineModel
    from cosparse.serving.program import export_model_program
    from cosparse.train.inputs import model_inputs

    cfg = config_from_mapping(config)
    num_dense = model_inputs(cfg).train.num_dense
    objective = objective_of(cfg.objective)
    tasks = None if objective.default else list(objective.tasks)
    if cfg.model.factory:
        trained = EngineModel(build_factory_model(cfg, num_dense), tasks, cfg.train.seed)
    else:  # (the zoo's model behind the same wrapper: the state's keys are the wrapper's)
        trained = build_model(cfg, num_dense, torch.device("cpu"))
    trained.load_state_dict(state)
    trained.eval()
    path = out / DENSE_DIR / PROGRAM_FILE
    inputs = export_model_program(trained.model, tasks, num_dense, path)
    return {"program": {"path": f"{DENSE_DIR}/{PROGRAM_FILE}", "sha256": sha256_file(path)},
            "inputs": inputs}
