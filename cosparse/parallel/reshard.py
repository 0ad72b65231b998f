"""A table's rows between layouts: the shards of any sharding merged into the whole table (the
form one process holds and checkpoints), and the whole table split into one owner's shard.

Row values and optimizer state travel together. A column-wise shard holds its columns of the
values and of each per-column state block (Adagrad's accumulator, Adam's two moments). The tier
placement hints (``device_ids``: the rows a device tier held) follow their rows."""

from __future__ import annotations

import numpy as np

from cosparse.config import TableConfig
from cosparse.optim import state_width
from cosparse.parallel.shards import row_owner
from cosparse.parallel.types import TableSharding


def _column_blocks(cfg: TableConfig, c0: int, c1: int) -> np.ndarray:
    """The whole row's columns (values, then each state block) that columns [c0, c1) hold."""
    blocks = state_width(cfg.optimizer.kind, cfg.dim) // cfg.dim if cfg.dim else 0
    return np.concatenate([np.arange(c0, c1) + k * cfg.dim for k in range(1 + blocks)])


def merge_shards(cfg: TableConfig, sharding: TableSharding,
                 parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The whole table from its owners' exports (``parts[i]``: owner i's), IDs ascending."""
    whole = _merge_rows(cfg, sharding, parts)
    hints = [p["device_ids"] for p in parts if "device_ids" in p]
    if hints:
        whole["device_ids"] = np.unique(np.concatenate(hints))
    return whole


def _merge_rows(cfg: TableConfig, sharding: TableSharding,
                parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if sharding.kind == "column_wise":
        width = cfg.dim + state_width(cfg.optimizer.kind, cfg.dim)
        ids = np.unique(np.concatenate([p["ids"] for p in parts]))
        rows = np.zeros((ids.shape[0], width), dtype=np.float32)
        for p, (c0, c1) in zip(parts, sharding.columns, strict=True):
            if p["ids"].shape[0] != ids.shape[0]:
                raise ValueError(f"table '{cfg.name}': column shards hold different rows")
            order = np.argsort(p["ids"], kind="stable")
            rows[:, _column_blocks(cfg, c0, c1)] = p["rows"][order]
        return {"ids": ids, "rows": rows}
    chosen = parts[:1] if sharding.replicated else parts
    ids = np.concatenate([p["ids"] for p in chosen])
    rows = np.concatenate([p["rows"] for p in chosen])
    order = np.argsort(ids, kind="stable")
    return {"ids": ids[order], "rows": rows[order]}


def split_table(cfg: TableConfig, sharding: TableSharding, owner: int,
                whole: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Owner ``owner``'s shard (an index into ``sharding.owners``) of the whole table."""
    ids, rows = whole["ids"], whole["rows"]
    hints = whole.get("device_ids")
    if sharding.route == "hash":
        mine = row_owner(ids, len(sharding.owners)) == owner
        out = {"ids": ids[mine], "rows": rows[mine]}
        if hints is not None:
            out["device_ids"] = hints[row_owner(hints, len(sharding.owners)) == owner]
        return out
    if sharding.kind == "column_wise":
        c0, c1 = sharding.columns[owner]
        out = {"ids": ids, "rows": np.ascontiguousarray(rows[:, _column_blocks(cfg, c0, c1)])}
    else:
        out = {"ids": ids, "rows": rows}
    if hints is not None:
        out["device_ids"] = hints
    return out
