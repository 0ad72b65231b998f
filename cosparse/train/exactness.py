"""What a run leaves that bit-identity promises (losses, rows with their optimizer state, dense
parameters), and how far two runs are apart: the first difference, and the largest one in each.
Shared by ``cosparse check`` and the exactness tests."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Outcome:
    """A run's ``losses``, its ``rows`` (table -> sorted IDs and their rows, optimizer state
    included) and its ``dense`` parameters and buffers; ``evictions``: rows the device tiers
    evicted, ``spilled_bytes``: bytes the host tiers sent down to the tier below (what shows
    that a placement really moved rows)."""

    losses: list[float]
    rows: dict[str, tuple[np.ndarray, np.ndarray]]
    dense: dict[str, torch.Tensor]
    evictions: int = 0
    spilled_bytes: int = 0


def sorted_rows(exported: dict[str, dict[str, np.ndarray]]
                ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``EmbeddingCollection.export_rows()`` as table -> (IDs sorted, their rows)."""
    out = {}
    for name, state in exported.items():
        order = np.argsort(state["ids"], kind="stable")
        out[name] = (state["ids"][order], state["rows"][order])
    return out


def first_difference(got: Outcome, ref: Outcome) -> str | None:
    """None when bit-identical; otherwise where the first difference is."""
    if len(got.losses) != len(ref.losses):
        return f"{len(got.losses)} steps ran, the reference ran {len(ref.losses)}"
    for i, (a, b) in enumerate(zip(got.losses, ref.losses, strict=True)):
        if not torch.equal(torch.tensor(a), torch.tensor(b)):
            return f"loss differs first at step {i + 1}: {a!r} vs {b!r}"
    for name, (ids, rows) in ref.rows.items():
        if name not in got.rows:
            return f"table '{name}': missing"
        gids, grows = got.rows[name]
        if not torch.equal(torch.from_numpy(gids), torch.from_numpy(ids)):
            return f"table '{name}': different row IDs ({gids.shape[0]} vs {ids.shape[0]})"
        if not torch.equal(torch.from_numpy(grows), torch.from_numpy(rows)):
            bad = np.flatnonzero((grows != rows).any(axis=1))
            return f"table '{name}': {bad.shape[0]} rows differ, first ID {ids[bad[0]]}"
    for k, v in ref.dense.items():
        if k not in got.dense or not torch.equal(got.dense[k], v):
            return f"dense parameter '{k}' differs"
    return None


@dataclass
class Distance:
    """The largest absolute difference of two runs in ``loss`` (per step), ``rows`` (per
    element, optimizer state included) and ``dense`` (per element); ``inf`` where they cannot
    be compared element by element (other step counts, row IDs, or shapes) or one is NaN where
    the other is not. ``identical``: bit for bit (``first`` names the first difference)."""

    loss: float
    rows: float
    dense: float
    identical: bool
    first: str | None


def distance(got: Outcome, ref: Outcome) -> Distance:
    """How far ``got`` is from ``ref``."""
    loss = (_largest(np.asarray(got.losses, np.float64), np.asarray(ref.losses, np.float64))
            if len(got.losses) == len(ref.losses) else float("inf"))
    rows = 0.0
    for name, (ids, values) in ref.rows.items():
        gids, gvalues = got.rows.get(name, (None, None))
        if gids is None or not np.array_equal(gids, ids):
            rows = float("inf")
            break
        rows = max(rows, _largest(gvalues, values))
    if set(got.rows) != set(ref.rows):
        rows = float("inf")
    dense = 0.0
    for k, v in ref.dense.items():
        g = got.dense.get(k)
        dense = max(dense, float("inf") if g is None else
                    _largest(g.detach().cpu().numpy(), v.detach().cpu().numpy()))
    first = first_difference(got, ref)
    return Distance(loss, rows, dense, first is None, first)


def _largest(a: np.ndarray, b: np.ndarray) -> float:
    """The largest |a - b| (inf for other shapes, or a NaN facing a number)."""
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    a64, b64 = a.astype(np.float64, copy=False), b.astype(np.float64, copy=False)
    nan_a, nan_b = np.isnan(a64), np.isnan(b64)
    if (nan_a != nan_b).any():
        return float("inf")
    both = ~nan_a
    x, y = a64[both], b64[both]
    with np.errstate(invalid="ignore"):
        diff = np.where(x == y, 0.0, np.abs(x - y))  # (an infinity against the other: inf)
    return float(diff.max(initial=0.0))
