"""A REGISTER request's JSON text, parsed and bounded before the shard acts on it.

The text is at most ``protocol.MAX_TEXT`` bytes; its nesting is bounded too (``MAX_JSON_DEPTH``,
checked on the raw text before ``json.loads``, whose recursion a deeply nested document would
exhaust). It is a JSON list of tables (in ``default``, or each in its ``namespace``), or
``{"namespace": NS, "tables": [...], "quota": {rows, bytes} | null}`` from a client of namespace
NS (its tables default to NS; a quota replaces NS's, on a shard without ``--namespaces``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np

from cosparse.config import TableConfig
from cosparse.ps import protocol as P
from cosparse.ps.limits import ShardError
from cosparse.ps.namespaces import DEFAULT_NAMESPACE, Quota, key_of, split_key
from cosparse.ps.table_config import table_config_from_dict

MAX_JSON_DEPTH = 16  # a REGISTER document is 4 deep ({tables: [{optimizer: {...}}]})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)


@dataclass
class RegisterRequest:
    """What a REGISTER asks: tables (``cfgs``, each in ``spaces[i]``), the namespace asking
    (None: not named) and its quota (``False``: none given; None: clear it)."""

    cfgs: list[TableConfig]
    spaces: list[str]
    requester: str | None
    quota: Quota | None | bool

    @property
    def keys(self) -> list[str]:
        return [key_of(ns, c.name) for ns, c in zip(self.spaces, self.cfgs, strict=True)]


def json_depth(text: str) -> int:
    """How deeply ``text``'s arrays and objects nest (brackets inside strings do not count)."""
    raw = np.frombuffer(_STRING.sub('""', text).encode("utf-8"), dtype=np.uint8)
    step = (np.isin(raw, (ord("["), ord("{"))).astype(np.int64)
            - np.isin(raw, (ord("]"), ord("}"))).astype(np.int64))
    return int(np.cumsum(step).max()) if step.size else 0


def parse_register(text: str, max_rows: int, namespace: str = DEFAULT_NAMESPACE
                   ) -> RegisterRequest:
    """The request in a REGISTER's text (``namespace``: where tables that name none go, when the
    document names no requester); a ``ShardError`` says what is wrong with it."""
    if len(text) > P.MAX_TEXT:
        raise ShardError("limit", f"REGISTER: a text of {len(text)} characters, over "
                                  f"{P.MAX_TEXT}")
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise ShardError("request", f"REGISTER: JSON nested {depth} deep, over the limit of "
                                    f"{MAX_JSON_DEPTH} (a list of table objects is 4 deep)")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ShardError("request", f"REGISTER: text is not JSON ({e})") from e
    requester, quota = None, False
    if isinstance(doc, dict):
        requester = doc.get("namespace")
        if requester is not None and not isinstance(requester, str):
            raise ShardError("request", "REGISTER: namespace must be a string")
        if requester is not None:
            split_key(f"{requester}/t")  # a valid namespace name
        if "quota" in doc:
            q = doc["quota"]
            quota = None if q is None else Quota.from_doc(q, max_rows)
        doc = doc.get("tables")
    if not isinstance(doc, list) or not all(isinstance(d, dict) for d in doc):
        raise ShardError("request", "REGISTER: expected a JSON list of table objects")
    spaces, cfgs = [], []
    for d in doc:
        d = dict(d)
        ns = d.pop("namespace", requester or namespace)
        if not isinstance(ns, str):
            raise ShardError("request", "REGISTER: a table's namespace must be a string")
        cfg = table_config_from_dict(d)
        spaces.append(split_key(key_of(ns, cfg.name))[0])
        cfgs.append(cfg)
    return RegisterRequest(cfgs, spaces, requester, quota)
