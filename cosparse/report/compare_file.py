"""``compare.json`` on disk: its format number, and reading one back (``cosparse report``).

Format 2 names the pipeline stages ``read, featurize, prep, plan, fill, gather, forward,
backward, optim, writeback``. Format 1 (no ``format`` key, before the renames) timed the gather
as ``supply`` and did not time ``featurize``, ``fill`` or ``writeback``: such a file is read
with ``supply`` shown as ``gather``, and says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cosparse.config import ConfigError

COMPARE_FORMAT = 2
_RENAMED_STAGES = {"supply": "gather"}  # format 1 -> 2


def read_compare(path: str | Path, log: Callable[[str], None]) -> dict[str, Any]:
    """The ``compare.json`` at ``path``, in the current format (an older one converted, with a
    line to ``log`` saying what changed); a file that is not one is a ``ConfigError``."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: cannot read it as compare.json ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), dict):
        raise ConfigError(f"{path}: not a compare.json (no 'runs' of `cosparse compare`)")
    fmt = doc.get("format", 1)
    if not isinstance(fmt, int) or fmt > COMPARE_FORMAT:
        raise ConfigError(f"{path}: compare.json format {fmt!r} is newer than this cosparse "
                          f"reads (format {COMPARE_FORMAT}); rerun `cosparse compare` or upgrade")
    if fmt < COMPARE_FORMAT:
        log(f"{path}: an older compare.json (format {fmt}, before the stage renames): its "
            "stage 'supply' (which timed the gather) is shown as 'gather'; featurize, fill and "
            "writeback were not timed then and show as empty")
        for run in doc["runs"].values():
            stages = run.get("stage_ms") or {}
            for old, new in _RENAMED_STAGES.items():
                if old in stages:
                    stages[new] = stages.pop(old)
        doc["format"] = COMPARE_FORMAT
    return doc
