"""The dense model beside an export's rows: ``dense/state_dict.pt`` (the checkpoint's dense
``state_dict``, the optimizer left out) and the manifest's ``dense`` entry, which names how to
rebuild the model around it:

    "dense": {"form": "state_dict", "file": {"path", "sha256"},
              "model": {"kind": "dlrm"} | {"factory": "pkg.mod:fn", "args": {...}},
              "config": <the checkpoint's config>, "program": null, "why": "<text>"}

``program`` would name a ``torch.export`` program of the dense part; none is written yet, and
``why`` says so (a reader rebuilds the model from ``model`` and ``config``: the built-in
``model.kind`` through the zoo, a ``model.factory`` by importing it, as training did).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from cosparse.serving.format import sha256_file

DENSE_DIR = "dense"
STATE_FILE = "state_dict.pt"
WHY_NO_PROGRAM = (
    "no torch.export program: this version serves the dense model from its state_dict, "
    "rebuilt through the model's reference (model.kind or model.factory + model.args) and the "
    "checkpoint's config; the embedding lookup stays outside the model either way")


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
    return {"form": "state_dict",
            "file": {"path": f"{DENSE_DIR}/{STATE_FILE}", "sha256": sha256_file(dst)},
            "model": reference, "config": meta["config"], "program": None,
            "why": WHY_NO_PROGRAM if reference is not None else WHY_NO_PROGRAM
            + "; and the config names no model.kind or model.factory (a model given in "
            "Python): name its factory in model.factory to serve it"}
