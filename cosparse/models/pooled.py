"""What the public zoo's models share: the base of the pooled ones (an
``EmbeddingBagCollection`` over the tables, a dense head of ``cosparse.nn.heads`` on top) and
the checks of their ``model.args``, which name the argument they refuse."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from cosparse.config import ConfigError, TableConfig
from cosparse.nn.dropout import TowerDropout
from cosparse.nn.embedding_bags import EmbeddingBagCollection
from cosparse.nn.model_batch import Batch


class PooledModel(nn.Module):
    """One logit per sample from the dense inputs and every feature's pooled embedding, in the
    tables' feature order; a subclass's head (``cosparse.nn.heads``) gives ``interact``."""

    def __init__(self, tables: Sequence[TableConfig], model: str) -> None:
        super().__init__()
        self.embeddings = EmbeddingBagCollection(tables)
        self.features = list(self.embeddings.features)
        for i, t in enumerate(self.embeddings.tables):
            if t.pooling == "none":
                raise ConfigError(f"tables[{i}].pooling: 'none' (unpooled sequences) needs a "
                                  f"sequence model (cosparse.models.din:build), not {model}")

    def interact(self, dense: torch.Tensor, embs: list[torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, batch: Batch) -> torch.Tensor:
        pooled = self.embeddings(batch)
        return self.interact(batch.dense, [pooled[f] for f in self.features]).squeeze(-1)

    def input_width(self, num_dense: int) -> int:
        """The width of ``inputs``: the dense inputs and every feature's pooled embedding."""
        return num_dense + sum(self.embeddings.dim_of(f) for f in self.features)

    def inputs(self, batch: Batch) -> torch.Tensor:
        """[B, input_width]: the dense inputs, then each feature's pooled embedding in order."""
        pooled = self.embeddings(batch)
        return torch.cat([batch.dense, *(pooled[f] for f in self.features)], dim=1)


def tower_dropout(p: Any) -> TowerDropout | None:
    """``model.args.dropout``: the towers' dropout, its masks seeded from the run's
    ``train.seed``, the rank and the step (None for 0: no dropout layer)."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise ConfigError(f"model.args.dropout: the towers' dropout rate must be in [0, 1), "
                          f"got {p!r}")
    return TowerDropout(float(p)) if p else None


def count(key: str, value: Any, least: int) -> int:
    """``model.args.<key>``: an integer of at least ``least``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"model.args.{key}: an integer of at least {least}, got {value!r}")
    return value


def task_names(tasks: Any) -> list[str]:
    """``model.args.tasks``: the objective's task names, one or more, distinct, each a plain
    word (the key of its output)."""
    if (isinstance(tasks, (str, bytes)) or not isinstance(tasks, Sequence) or not tasks
            or any(not isinstance(t, str) or not t or "." in t for t in tasks)
            or len(set(tasks)) != len(tasks)):
        raise ConfigError(f"model.args.tasks: the objective's task names, one or more, "
                          f"distinct (objective.tasks), got {tasks!r}")
    return list(tasks)


def hidden_sizes(key: str, sizes: Any) -> list[int]:
    """``model.args.<key>``: a tower's hidden widths, none or more (an empty list: the tower is
    one linear layer)."""
    empty = isinstance(sizes, Sequence) and not isinstance(sizes, (str, bytes)) and not sizes
    return [] if empty else layer_sizes(key, sizes)


def layer_sizes(key: str, sizes: Any) -> list[int]:
    """``model.args.<key>``: one or more positive layer widths."""
    if (isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence) or not sizes
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes)):
        raise ConfigError(f"model.args.{key}: need one or more positive layer sizes, got "
                          f"{sizes!r}")
    return list(sizes)


def feature_groups(known: list[str], groups: dict[str, list[str]], what: str) -> None:
    """Each group of ``groups`` (``model.args.<key>``: its features) names one or more of the
    tables' features ``known``; ``what`` says whose features they are (``tower``: "the user
    tower's features")."""
    for key, names in groups.items():
        unknown = [f for f in names if f not in known]
        if not names or unknown:
            raise ConfigError(f"model.args.{key}: {what.format(key=key)}, one or more of the "
                              f"tables' ({known}); got {names}")
