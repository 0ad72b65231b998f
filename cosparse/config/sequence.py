"""``model.sasrec``: SASRec's encoder (``model.kind: sasrec``), and what the kind sets on the
tables: every table unpooled (``pooling: none``), so the model reads its history event by event
whatever the tables say. Its positions are ``data.events.max_len``'s."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cosparse.config.root import Config


@dataclass
class SASRecConfig:
    """``layers`` causal self-attention blocks of ``heads`` heads (which divide the rows' dim)
    and a feed-forward of ``inner`` units; ``history``: the features summed into each event's
    input (empty: every ``hist_*``); ``item``: those summed into an item's embedding (empty:
    every other feature but ``user``); ``logq``: correct the in-batch softmax by each item's
    streaming frequency."""

    layers: int = 2
    heads: int = 2
    inner: int = 256
    history: list[str] = field(default_factory=list)
    item: list[str] = field(default_factory=list)
    logq: bool = True


def unpool_for_sequences(cfg: Config) -> None:
    """``model.kind: sasrec`` reads every table unpooled (``pooling: none``)."""
    if cfg.model.kind == "sasrec":
        for t in cfg.tables:
            t.pooling = "none"

