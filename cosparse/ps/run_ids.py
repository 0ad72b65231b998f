"""Which training run a namespace's rows on a shard belong to, on the wire (issue 32, items 1-2).

A trainer names its run (``PSConnection.run_id``: made at a fresh start, kept across resumes) in
every SNAPSHOT it asks for: one uint8 array holding the JSON ``{"namespace": NS, "run_id": ID}``.
The shard keeps the newest run ID per namespace, writes them all into each snapshot's manifest
(``run_ids``), restores them with the rows and reports them in STATS, so a resume can tell its
own run's rows from another run's that happen to sit under the same snapshot names.

CLEAR (``cosparse train --fresh`` against external shards) drops every table of one namespace
and its run ID: the namespace its text names on a shard that is one trust domain, and only the
session's own namespace on a shard with ``ps serve --namespaces``.
"""

from __future__ import annotations

import json
import re

import numpy as np

from cosparse.config.store import PS_NAME_PATTERN
from cosparse.ps.limits import ShardError

__all__ = ["MAX_RUN_DOC_BYTES", "clear_namespace_of", "parse_run_doc", "run_doc_array"]

MAX_RUN_DOC_BYTES = 1024
_NAME = re.compile(PS_NAME_PATTERN)


def run_doc_array(namespace: str, run_id: str) -> np.ndarray:
    """The array a SNAPSHOT request carries to name the run of ``namespace``'s rows."""
    raw = json.dumps({"namespace": namespace, "run_id": run_id}).encode()
    return np.frombuffer(raw, dtype=np.uint8)


def parse_run_doc(arrays: list[np.ndarray], session_ns: str | None) -> tuple[str, str] | None:
    """(namespace, run ID) a SNAPSHOT request names (None: it names none, an older client).
    With ``--namespaces`` (``session_ns`` set) a session names only its own namespace's run."""
    if not arrays:
        return None
    if len(arrays) != 1 or arrays[0].dtype != np.uint8 or arrays[0].ndim != 1 \
            or arrays[0].shape[0] > MAX_RUN_DOC_BYTES:
        raise ShardError("request", "SNAPSHOT takes no array, or one uint8 array of at most "
                                    f"{MAX_RUN_DOC_BYTES} bytes: {{namespace, run_id}} as JSON")
    try:
        doc = json.loads(arrays[0].tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ShardError("request", f"SNAPSHOT: the run document is not JSON ({e})") from e
    ns, run_id = (doc.get("namespace"), doc.get("run_id")) if isinstance(doc, dict) else (0, 0)
    for what, v in (("namespace", ns), ("run_id", run_id)):
        if not isinstance(v, str) or not _NAME.match(v):
            raise ShardError("request", f"SNAPSHOT: bad {what} {v!r} in the run document (1 to "
                                        "128 letters, digits, '_', '.', '-')")
    if session_ns is not None and ns != session_ns:
        raise ShardError("denied", f"SNAPSHOT naming the run of namespace '{ns}' on a session of "
                                   f"namespace '{session_ns}': a session names only its own run")
    return ns, run_id


def clear_namespace_of(text: str, session_ns: str | None) -> str:
    """The namespace a CLEAR drops: the one its text names; with ``--namespaces`` only the
    session's own (an empty text names it)."""
    if session_ns is not None:
        if text and text != session_ns:
            raise ShardError("denied", f"CLEAR of namespace '{text}' on a session of namespace "
                                       f"'{session_ns}': a namespace clears only its own tables")
        return session_ns
    if not _NAME.match(text):
        raise ShardError("request", f"CLEAR: bad namespace {text!r} (1 to 128 letters, digits, "
                                    "'_', '.', '-')")
    return text
