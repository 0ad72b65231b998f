"""Plain data of the feature platform: column kinds, Column, RawBatch and FeatureSpecError.

A ``Column`` holds one column for N rows in a vectorisable layout:

- scalar ``int`` / ``float``: ``values`` 1-D int64 / float64 [N], optional bool ``present`` [N];
- scalar ``string``: ``values`` uint8 bytes, ``offsets`` int64 [N + 1] (Arrow layout), ``present``;
- jagged ``list_int`` / ``list_float``: flat ``values`` + int64 ``lengths`` [N] (a null list is empty);
- jagged ``list_string``: ``values`` uint8 bytes, ``offsets`` int64 [elements + 1], ``lengths`` [N].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

INT = "int"
FLOAT = "float"
STRING = "string"
LIST_INT = "list_int"
LIST_FLOAT = "list_float"
LIST_STRING = "list_string"
ColumnKind = str
KINDS: tuple[str, ...] = (INT, FLOAT, STRING, LIST_INT, LIST_FLOAT, LIST_STRING)
SCALAR_KINDS = (INT, FLOAT, STRING)
LIST_KINDS = (LIST_INT, LIST_FLOAT, LIST_STRING)
STRING_KINDS = (STRING, LIST_STRING)

# output kinds of a feature
SPARSE = "sparse"
DENSE = "dense"
SEQUENCE = "sequence"
OUTPUT_KINDS: tuple[str, ...] = (SPARSE, DENSE, SEQUENCE)


class FeatureSpecError(ValueError):
    """A bad feature spec (unknown transform, parameter or input, a cycle, a type mismatch, a stale
    pinned version). Raised at load / validation time; the message names the feature and the key."""


def is_list(kind: str) -> bool:
    return kind in LIST_KINDS


def element_kind(kind: str) -> str:
    """The kind of one element: ``list_int`` -> ``int``; scalars map to themselves."""
    return kind[5:] if kind in LIST_KINDS else kind


def list_of(kind: str) -> str:
    return kind if kind in LIST_KINDS else f"list_{kind}"


@dataclass(frozen=True)
class ColType:
    """Static type of a column while a spec is checked: its kind and whether it holds IDs."""

    kind: str
    categorical: bool = False


@dataclass
class Column:
    """One column of N rows (see the module docstring for the layouts)."""

    kind: str
    values: np.ndarray
    present: np.ndarray | None = None
    lengths: np.ndarray | None = None
    offsets: np.ndarray | None = None
    categorical: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown column kind {self.kind!r} (known: {', '.join(KINDS)})")
        if is_list(self.kind) and self.lengths is None:
            raise ValueError(f"a {self.kind} column needs lengths")
        if self.kind in STRING_KINDS and self.offsets is None:
            raise ValueError(f"a {self.kind} column needs offsets")
        if self.present is not None and len(self.present) != self.num_rows:
            raise ValueError(f"present has {len(self.present)} rows, column has {self.num_rows}")
        if self.lengths is not None and int(self.lengths.sum()) != self.num_elements:
            raise ValueError(f"lengths sum to {int(self.lengths.sum())}, column has "
                             f"{self.num_elements} elements")

    @property
    def num_elements(self) -> int:
        if self.kind in STRING_KINDS:
            return len(self.offsets) - 1  # type: ignore[arg-type]
        return len(self.values)

    @property
    def num_rows(self) -> int:
        if self.lengths is not None:
            return len(self.lengths)
        return self.num_elements

    def present_mask(self) -> np.ndarray:
        """bool [N]: rows that hold a value (lists: always True; an empty list is a value)."""
        if self.present is None:
            return np.ones(self.num_rows, np.bool_)
        return self.present

    def filter(self, keep: np.ndarray) -> Column:
        """The rows where ``keep`` is set (vectorised)."""
        keep = np.asarray(keep, np.bool_)
        elem_keep = keep if self.lengths is None else np.repeat(keep, self.lengths)
        lengths = None if self.lengths is None else self.lengths[keep]
        present = None if self.present is None else self.present[keep]
        if self.kind in STRING_KINDS:
            off = self.offsets
            el = np.diff(off)  # type: ignore[arg-type]
            data = self.values[np.repeat(elem_keep, el)]
            offsets = np.zeros(int(elem_keep.sum()) + 1, np.int64)
            np.cumsum(el[elem_keep], out=offsets[1:])
            return Column(self.kind, data, present, lengths, offsets, self.categorical)
        return Column(self.kind, self.values[elem_keep], present, lengths, None, self.categorical)

    # --- constructors -------------------------------------------------------------------------
    @classmethod
    def ints(cls, values: Sequence[int | None] | np.ndarray, present: np.ndarray | None = None
             ) -> Column:
        """An int column; ``None`` entries of a Python list are missing."""
        if isinstance(values, np.ndarray):
            return cls(INT, values.astype(np.int64, copy=False), present)
        pres = np.array([v is not None for v in values], np.bool_)
        vals = np.array([0 if v is None else v for v in values], np.int64)
        return cls(INT, vals, None if pres.all() else pres)

    @classmethod
    def floats(cls, values: Sequence[float | None] | np.ndarray, present: np.ndarray | None = None
               ) -> Column:
        if isinstance(values, np.ndarray):
            return cls(FLOAT, values.astype(np.float64, copy=False), present)
        pres = np.array([v is not None for v in values], np.bool_)
        vals = np.array([0.0 if v is None else v for v in values], np.float64)
        return cls(FLOAT, vals, None if pres.all() else pres)

    @classmethod
    def strings(cls, values: Sequence[str | None]) -> Column:
        """A string column from Python strings (for tests and small inputs)."""
        import pyarrow as pa

        return from_arrow_strings(pa.array(list(values), pa.large_string()))

    @classmethod
    def jagged(cls, rows: Sequence[Sequence[float | int]], kind: str = LIST_INT) -> Column:
        """A list column from Python lists (for tests and small inputs)."""
        lengths = np.array([len(r) for r in rows], np.int64)
        dt = np.float64 if kind == LIST_FLOAT else np.int64
        flat = [x for r in rows for x in r]
        return cls(kind, np.array(flat, dt), None, lengths)

    def to_pylist(self) -> list:
        """Rows as Python values (None where missing); for tests and debugging."""
        pres = self.present_mask()
        if self.kind in STRING_KINDS:
            data = self.values.tobytes()
            off = self.offsets
            elems = [data[off[i]:off[i + 1]].decode() for i in range(len(off) - 1)]  # type: ignore
        else:
            elems = self.values.tolist()
        if self.lengths is None:
            return [e if p else None for e, p in zip(elems, pres.tolist(), strict=True)]
        out, k = [], 0
        for n in self.lengths.tolist():
            out.append(elems[k:k + n])
            k += n
        return out


def from_arrow_strings(arr: object, lengths: np.ndarray | None = None) -> Column:
    """A string (or, with ``lengths``, list_string) Column over an Arrow string array's buffers."""
    import pyarrow as pa

    a = arr.cast(pa.large_string())  # type: ignore[attr-defined]
    bufs = a.buffers()
    offsets = np.frombuffer(bufs[1], np.int64)[a.offset: a.offset + len(a) + 1]
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    lo, hi = int(offsets[0]), int(offsets[-1])
    data, offsets = data[lo:hi], offsets - lo
    valid = np.asarray(a.is_valid().to_numpy(zero_copy_only=False), np.bool_)
    if lengths is not None:
        return Column(LIST_STRING, data, None, lengths, offsets)
    return Column(STRING, data, None if valid.all() else valid, None, offsets)


@dataclass
class RawBatch:
    """One batch of raw columns from a RawSource."""

    columns: dict[str, Column]
    labels: np.ndarray
    index: int = 0
    bad_records: int = 0
    source: str = field(default="", compare=False)

    @property
    def num_rows(self) -> int:
        return int(self.labels.shape[0])
