"""The ``data.events`` section: how an interaction log becomes behaviour-sequence samples
(histories, ties, layout, a retrieval model's mixed negatives), and its synthetic log."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from cosparse.config.synthetic import SequenceSyntheticConfig


@dataclass
class EventsConfig:
    """Behaviour-sequence samples from an event log (reader ``taobao_events``): one sample per
    target event, with the user's most recent ``max_len`` events strictly before it."""

    max_len: int = 100
    min_history: int = 1
    # behaviours labelled 1 (None: buy); data.columns.labels labels several tasks instead
    positive: list[str] | None = None
    shuffle: bool = True  # train samples in a seeded random order (else by time)
    seed: int = 0
    # reader interactions: "rows", one interaction per row (csv, tsv or parquet), or
    # "user_items", one user per line: "user item1 item2 ..." in time order
    layout: Literal["rows", "user_items"] = "rows"
    # events of one user at one time: "strict", none is in another's history (the time says
    # nothing of their order); "keep_file_order", the earlier rows are the later rows' history
    ties: Literal["strict", "keep_file_order"] = "strict"
    # a retrieval model's mixed negatives: per sample, this many items drawn uniformly from the
    # training split's items (features neg{j}_item and neg{j}_<column>), which every user of the
    # batch is scored against beside the batch's own items
    uniform_negatives: int = 0
    synthetic: SequenceSyntheticConfig = field(default_factory=SequenceSyntheticConfig)
