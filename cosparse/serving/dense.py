"""The dense model beside an export's rows: ``dense/state_dict.pt`` (the checkpoint's dense
``state_dict``, the optimizer left out) and the manifest's ``dense`` entry, which names how to
rebuild the model around it:

    "dense": {"form": "state_dict", "file": {"path", "sha256"},
              "model": {"kind": "dlrm"} | {"factory": "pkg.mod:fn", "args": {...}},
              "config": <the checkpoint's config>, "program": null, "why": "<text>"}

``program`` names a ``torch.export`` program of the dense part where the model exports, the
embedding lookup outside it: a built-in pooled model's (``model.kind`` dlrm, deepfm or dcn),
which takes the dense inputs and each feature's pooled embedding (``inputs``: the number of
dense inputs and the features in order), or a ``model.factory`` model's, which also takes each
``pooling: none`` feature's rows and offsets (``inputs.jagged``) and returns each task's outputs
(``cosparse.serving.program``). Otherwise ``program`` is null and ``why`` says why:
a reader rebuilds the model from ``model`` and ``config`` (the built-in ``model.kind`` through
the zoo, a ``model.factory`` by importing it, as training did) and loads the state_dict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from cosparse.serving.format import sha256_file
from cosparse.serving.program import PROGRAM_FILE

DENSE_DIR = "dense"
STATE_FILE = "state_dict.pt"
EXPORTED_KINDS = ("dlrm", "deepfm", "dcn")  # pooled inputs only (din's sequences are jagged)
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
    elif "factory" not in reference and reference["kind"] not in EXPORTED_KINDS:
        entry["why"] = (f"no torch.export program: model.kind {reference['kind']} takes "
                        f"jagged sequence embeddings; {WHY_FALLBACK}")
    else:
        try:
            export = export_factory_program if "factory" in reference else export_program
            entry.update(export(meta["config"], dense["model"], out))
        except Exception as e:  # (whatever torch.export or the model raised: the fallback)
            entry["why"] = (f"torch.export failed ({type(e).__name__}: {e}); {WHY_FALLBACK}")
    return entry


class PooledDense(nn.Module):
    """A built-in model's dense part: (dense [B, n], pooled embeddings [B, dim] per feature,
    in the model's feature order) -> logits [B]."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, dense: torch.Tensor, pooled: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return self.model.interact(dense, list(pooled)).squeeze(-1)  # type: ignore[no-any-return]


def export_factory_program(config: dict[str, Any], state: dict[str, Any], out: Path
                           ) -> dict[str, Any]:
    """Write the ``torch.export`` program of a ``model.factory`` model into ``out/dense/``; the
    entry's ``program`` and ``inputs``."""
    from cosparse.api.factory import build_factory_model
    from cosparse.config import config_from_mapping
    from cosparse.config.objective import objective_of
    from cosparse.nn.engine_model import EngineModel
    from cosparse.serving.program import export_model_program
    from cosparse.train.inputs import model_inputs

    cfg = config_from_mapping(config)
    num_dense = model_inputs(cfg).train.num_dense
    objective = objective_of(cfg.objective)
    tasks = None if objective.default else list(objective.tasks)
    trained = EngineModel(build_factory_model(cfg, num_dense), tasks, cfg.train.seed)  # (keys)
    trained.load_state_dict(state)
    trained.eval()
    path = out / DENSE_DIR / PROGRAM_FILE
    inputs = export_model_program(trained.model, tasks, num_dense, path)
    return {"program": {"path": f"{DENSE_DIR}/{PROGRAM_FILE}", "sha256": sha256_file(path)},
            "inputs": inputs}


def export_program(config: dict[str, Any], state: dict[str, Any], out: Path) -> dict[str, Any]:
    """Write the ``torch.export`` program of a built-in pooled model into ``out/dense/``; the
    entry's ``program`` and ``inputs``. The batch dimension is dynamic."""
    from cosparse.config import config_from_mapping
    from cosparse.models.builtin import build_model
    from cosparse.train.inputs import model_inputs

    cfg = config_from_mapping(config)
    num_dense = model_inputs(cfg).train.num_dense
    engine = build_model(cfg, num_dense, torch.device("cpu"))
    engine.load_state_dict(state)
    engine.eval()
    model = engine.model  # (the zoo's pooled model: its head's interact is the dense part)
    features = list(model.features)
    dims = [model.embeddings.dim_of(f) for f in features]
    batch = torch.export.Dim("batch", min=1)
    example = (torch.zeros(2, num_dense), tuple(torch.zeros(2, d) for d in dims))
    program = torch.export.export(PooledDense(model), example,
                                  dynamic_shapes=({0: batch}, tuple({0: batch} for _ in dims)))
    path = out / DENSE_DIR / PROGRAM_FILE
    torch.export.save(program, path)
    return {"program": {"path": f"{DENSE_DIR}/{PROGRAM_FILE}", "sha256": sha256_file(path)},
            "inputs": {"num_dense": num_dense, "features": features}}
