"""``model.two_tower``: two-tower retrieval's towers (``model.kind: two_tower``), and the rules of
a retrieval model (``two_tower``, ``sasrec``): one retrieval task (the objective's, or ``label``
by default), an interaction log's samples to rank the item corpus of, in-batch negatives rather
than sampled pointwise ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cosparse.config.errors import ConfigError
from cosparse.config.objective import ObjectiveConfig, TaskConfig

if TYPE_CHECKING:
    from cosparse.config.root import Config

RETRIEVAL_READERS = ("interactions", "taobao_events")
RETRIEVAL_KINDS = ("two_tower", "sasrec")


@dataclass
class TwoTowerConfig:
    """The user tower reads ``user`` features, the item tower ``item`` features (empty: the
    user ID and every history; the item ID and its own columns); each is an MLP of ``tower``
    widths, the last the embedding's; ``logq``: correct the in-batch softmax by each item's
    streaming frequency."""

    tower: list[int] = field(default_factory=lambda: [64, 32])
    user: list[str] = field(default_factory=list)
    item: list[str] = field(default_factory=list)
    logq: bool = True


def default_retrieval_objective(cfg: Config) -> None:
    """A retrieval model (``model.kind: two_tower | sasrec``) without an objective section trains
    one retrieval task, ``label``."""
    if cfg.model.kind in RETRIEVAL_KINDS and cfg.objective is None:
        cfg.objective = ObjectiveConfig({"label": TaskConfig(kind="retrieval")})


def check_uniform_negatives(cfg: Config) -> None:
    """``data.events.uniform_negatives`` are a retrieval model's: a built-in kind of another
    family would read them as features it does not know."""
    kind = cfg.model.kind
    if cfg.data.events.uniform_negatives and cfg.data.reader not in RETRIEVAL_READERS:
        raise ConfigError(f"data.events.uniform_negatives: drawn by an interaction log's reader "
                          f"({' or '.join(RETRIEVAL_READERS)}); got '{cfg.data.reader}'")
    if cfg.data.events.uniform_negatives and kind is not None and kind not in RETRIEVAL_KINDS:
        raise ConfigError(f"data.events.uniform_negatives: mixed negatives are a retrieval "
                          f"model's (model.kind {' or '.join(RETRIEVAL_KINDS)}, or your own); "
                          f"model.kind '{kind}' ranks its samples pointwise (data.negatives)")


def validate_retrieval(cfg: Config) -> None:
    """One retrieval task, an interaction log's reader, no sampled pointwise negatives; a
    two-tower's towers of one or more layers."""
    kind = cfg.model.kind
    what = {"two_tower": "two-tower retrieval", "sasrec": "SASRec"}.get(str(kind), str(kind))
    tasks = cfg.objective.tasks if cfg.objective is not None else {}
    if len(tasks) != 1 or next(iter(tasks.values())).kind != "retrieval":
        raise ConfigError(f"objective.tasks: model.kind '{kind}' trains one task of kind "
                          f"retrieval, e.g. {{label: {{kind: retrieval}}}}; got "
                          f"{ {k: t.kind for k, t in tasks.items()} }")
    if cfg.data.reader not in RETRIEVAL_READERS:
        raise ConfigError(f"data.reader: {what} ranks an interaction log's item "
                          f"corpus; use one of {list(RETRIEVAL_READERS)}, got "
                          f"'{cfg.data.reader}'")
    if cfg.data.negatives is not None:
        raise ConfigError(f"data.negatives: {what} takes the batch's other items as its "
                          "negatives; leave out the sampled pointwise ones")
    if kind == "two_tower" and not cfg.model.two_tower.tower:
        raise ConfigError("model.two_tower.tower: one or more layer sizes (the last is the "
                          "embedding's)")
