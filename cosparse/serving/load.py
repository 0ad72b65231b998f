"""Reading serving exports back: a full export plus its deltas, applied in order, as one lookup
table per embedding table.

``load_tables(full_dir, deltas=[d1, d2])`` checks every file's sha256 against its manifest, that the
first export is a full one and that each delta starts where the one before it ended
(``delta.since == previous.step``) with the same tables, dims and dtypes, and applies the deltas
(their rows replace or add rows; their removed IDs go). Each ``LookupTable`` holds its IDs sorted
and looks a batch of IDs up with one ``np.searchsorted``.

Missing IDs: ``lookup`` returns zero rows for them (what a serving model uses for an ID it has no
row for), and ``find`` returns the rows together with the mask of the IDs found, for a caller that
must tell them apart or refuse.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cosparse.serving.format import ServingError, read_manifest, read_table, verify


@dataclass
class LookupTable:
    """One table's rows at ``step``: ``ids`` sorted ascending, ``rows[i]`` the row of ``ids[i]``."""

    name: str
    dim: int
    step: int
    ids: np.ndarray
    rows: np.ndarray

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def find(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rows [len(ids), dim], found [len(ids)] bool): zero rows where not found."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        pos = np.searchsorted(self.ids, ids)
        safe = np.minimum(pos, max(len(self) - 1, 0))
        found = (pos < len(self)) & (self.ids[safe] == ids) if len(self) else \
            np.zeros(ids.shape[0], np.bool_)
        out = np.zeros((ids.shape[0], self.dim), self.rows.dtype)
        out[found] = self.rows[safe[found]]
        return out, found

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """The rows of ``ids`` ([len(ids), dim]); zeros for IDs the table has no row for."""
        return self.find(ids)[0]


def _apply(base: LookupTable, ids: np.ndarray, rows: np.ndarray, removed: np.ndarray,
           step: int) -> LookupTable:
    """``base`` with a delta's rows upserted and its removed IDs dropped."""
    keep = ~np.isin(base.ids, np.concatenate([ids, removed]))
    merged_ids = np.concatenate([base.ids[keep], ids])
    merged_rows = np.concatenate([base.rows[keep], rows])
    order = np.argsort(merged_ids, kind="stable")
    return LookupTable(base.name, base.dim, step, merged_ids[order], merged_rows[order])


def load_tables(path: str | Path, deltas: Sequence[str | Path] = (), check: bool = True
                ) -> dict[str, LookupTable]:
    """The tables of the full export at ``path`` with ``deltas`` applied in order (each made by
    ``cosparse export --since`` the previous one's step). ``check``: verify every file's sha256
    first (default). Raises ``ServingError`` naming the directory and what is wrong."""
    dirs = [Path(path), *(Path(d) for d in deltas)]
    manifests = [read_manifest(d) for d in dirs]
    first = manifests[0]
    if first["kind"] != "full":
        raise ServingError(f"{dirs[0]}: a delta (since step {first['since']}); load starts from "
                           "a full export (cosparse export without --since)")
    for i in range(1, len(dirs)):
        prev, d, m = manifests[i - 1], dirs[i], manifests[i]
        if m["kind"] != "delta":
            raise ServingError(f"{d}: a full export where a delta was expected")
        if m["since"] != prev["step"]:
            raise ServingError(f"{d}: a delta since step {m['since']}, but the export before "
                               f"it is at step {prev['step']} (export with --since "
                               f"{prev['step']}, or give the deltas in order)")
        shape = {n: (t["dim"], t["dtype"]) for n, t in m["tables"].items()}
        want = {n: (t["dim"], t["dtype"]) for n, t in first["tables"].items()}
        if shape != want:
            raise ServingError(f"{d}: tables {shape} do not match the full export's {want}")
    if check:
        for d, m in zip(dirs, manifests, strict=True):
            verify(d, m)
    out = {}
    for name, tm in first["tables"].items():
        ids, rows, _ = read_table(dirs[0], first, name)
        table = LookupTable(name, int(tm["dim"]), int(first["step"]), ids, rows)
        for d, m in zip(dirs[1:], manifests[1:], strict=True):
            table = _apply(table, *read_table(d, m, name), int(m["step"]))
        out[name] = table
    return out
