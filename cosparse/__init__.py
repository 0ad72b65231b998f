"""cosparse: sparse embedding training engine.

Importing it first sets OpenMP's passive wait policy for this process and its children, unless
the environment sets one (``cosparse.omp_wait``): it must happen before torch loads. Then it
points numba's kernel cache at a folder keyed by the sources (``cosparse.numba_cache``): before
any kernel is decorated.

The public API (``cosparse.api``) is reached from here, loaded on first use so that importing
``cosparse`` stays light: ``cosparse.Trainer``, ``cosparse.RunResult``,
``cosparse.EmbeddingBagCollection``, ``cosparse.Batch``, ``cosparse.Jagged``,
``cosparse.Objective``, ``cosparse.load_config`` and ``cosparse.check`` (with its
``CheckResult``).
"""

from __future__ import annotations

import importlib
from typing import Any

# (both import only the standard library, so their order does not matter: each must run before
# torch, numba or any kernel module is imported)
from cosparse import (
    numba_cache,  # noqa: F401
    omp_wait,  # noqa: F401
)

_PUBLIC = {
    "Trainer": "cosparse.api.trainer",
    "RunResult": "cosparse.api.trainer",
    "EmbeddingBagCollection": "cosparse.nn.embedding_bags",
    "Batch": "cosparse.nn.model_batch",
    "Jagged": "cosparse.nn.types",
    "load_config": "cosparse.api.config",
    "check": "cosparse.api.check",
    "CheckResult": "cosparse.api.check",
    "Objective": "cosparse.api.objective",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    """The public API's names, imported when first asked for."""
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'cosparse' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
