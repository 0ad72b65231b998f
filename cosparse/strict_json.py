"""Metrics as strict JSON: JSON has no NaN, so an undefined figure is written as ``null``.

``json_safe`` replaces every NaN or infinite float, and ``dumps_metrics`` dumps with
``allow_nan=False`` so that a non-finite value that escaped it fails loudly instead of writing
invalid JSON.
"""

from __future__ import annotations

import json
import math
from typing import Any


def json_safe(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float (in dicts, lists and tuples) replaced by None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    if hasattr(obj, "item") and getattr(obj, "ndim", None) == 0:  # numpy / torch scalars
        return json_safe(obj.item())
    return obj


def dumps_metrics(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of metrics with undefined values as ``null`` (strict JSON)."""
    return json.dumps(json_safe(obj), allow_nan=False, **kwargs)
