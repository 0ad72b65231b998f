"""What the audit journal records of the code and the configuration a trial ran: the git SHA
(or ``unknown`` and a hash of the package's sources, outside a git checkout) and a hash of the
configuration mapping."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

_PACKAGE = Path(__file__).resolve().parents[1]


def code_version() -> dict[str, str]:
    """``{"git_sha": ..., "source_hash": ...}`` of the running cosparse."""
    h = hashlib.sha256()
    for p in sorted(_PACKAGE.rglob("*.py")):
        h.update(str(p.relative_to(_PACKAGE)).encode())
        h.update(p.read_bytes())
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_PACKAGE, capture_output=True,
                             text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        sha = "unknown"
    return {"git_sha": sha, "source_hash": h.hexdigest()}


def config_hash(raw: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()
