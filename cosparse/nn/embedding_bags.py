"""``EmbeddingBagCollection``: the lookup module a user puts in a model of their own.

It holds its tables' configs and no rows: the model never chooses a placement. A
``cosparse.Trainer`` finds it in the model by type and places it, installing the engine's
embedding collection over the placements that ``store`` / ``supply`` / ``parallel`` describe
(``place``). Called on a ``cosparse.Batch`` it gives ``dict[feature, Tensor[B, dim]]`` in its
tables' feature order, or a ``cosparse.Jagged`` value for a ``pooling: none`` table.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from cosparse.config import Config, ConfigError, TableConfig, from_dict
from cosparse.config.bounds import first_violation
from cosparse.config.tables import validate_tables
from cosparse.nn.model_batch import Batch
from cosparse.nn.types import Jagged

Lookup = dict[str, torch.Tensor | Jagged]


class EmbeddingBagCollection(nn.Module):
    """Pooled (or jagged) embeddings of every feature of ``tables`` (``TableConfig``s or
    mappings in the form of the config's ``tables:`` entries)."""

    def __init__(self, tables: Sequence[TableConfig | Mapping[str, Any]]) -> None:
        super().__init__()
        self.tables: list[TableConfig] = table_configs(tables)
        self.features: list[str] = [f for t in self.tables for f in t.features]
        self.register_module("_engine", None)  # the trainer's embedding collection, once placed
        self._dry = False  # (set while a trainer materialises lazy modules: zeros, no lookup)

    @property
    def placed(self) -> bool:
        return self._engine is not None

    def place(self, engine: nn.Module | None) -> None:
        """Install the engine's embedding collection (a trainer's call; None: unplace)."""
        self._engine = engine

    def dim_of(self, feature: str) -> int:
        for t in self.tables:
            if feature in t.features:
                return t.dim
        raise KeyError(f"feature '{feature}' is in none of this collection's tables")

    def forward(self, batch: Batch) -> Lookup:
        """Per feature, in the tables' order: pooled [B, dim] rows, or a ``Jagged`` value."""
        if not isinstance(batch, Batch):
            raise TypeError(f"EmbeddingBagCollection takes the cosparse.Batch the trainer hands "
                            f"the model's forward, not a {type(batch).__name__}")
        if self._dry:
            return self._zeros(batch)
        if self._engine is None:
            raise RuntimeError(
                "EmbeddingBagCollection: not placed yet: train the model through "
                "cosparse.Trainer(model, config), which places its tables as the config's "
                "store, supply and parallel sections say (a closed trainer unplaces them)")
        out = batch.looked_up(self._engine)
        return {f: out[f] for f in self.features}

    def _zeros(self, batch: Batch) -> Lookup:
        """Rows of zeros in the shapes a lookup gives (what materialising lazy modules needs)."""
        raw, dev = batch._prepared.batch, batch.device
        out: Lookup = {}
        for t in self.tables:
            for f in t.features:
                if t.pooling != "none":
                    out[f] = torch.zeros(raw.batch_size, t.dim, device=dev)
                    continue
                _, lengths = raw.feature(f)
                offsets = torch.zeros(lengths.shape[0] + 1, dtype=torch.int64)
                torch.cumsum(lengths, 0, out=offsets[1:])
                out[f] = Jagged(torch.zeros(int(offsets[-1]), t.dim, device=dev),
                                lengths.to(dev), offsets.to(dev))
        return out

    def extra_repr(self) -> str:
        return ", ".join(f"{t.name}: {t.features} dim {t.dim} pooling {t.pooling}"
                         for t in self.tables)


def table_configs(tables: Sequence[TableConfig | Mapping[str, Any]]) -> list[TableConfig]:
    """``tables`` as ``TableConfig``s, converted and validated like the config's ``tables:``
    (errors name ``EmbeddingBagCollection tables[i]...``)."""
    if isinstance(tables, (str, Mapping)) or not isinstance(tables, Sequence):
        raise TypeError("EmbeddingBagCollection(tables): a list of cosparse.config.TableConfig "
                        f"or of mappings, not a {type(tables).__name__}")
    out: list[TableConfig] = []
    where = "EmbeddingBagCollection"
    for i, t in enumerate(tables):
        key = f"tables[{i}]"
        if isinstance(t, TableConfig):
            out.append(copy.deepcopy(t))
        elif isinstance(t, Mapping):
            try:
                out.append(from_dict(TableConfig, dict(t), key))
            except ConfigError as e:
                raise ConfigError(f"{where} {e}") from None
        else:
            raise TypeError(f"{where} {key}: a TableConfig or a mapping, not a "
                            f"{type(t).__name__}")
        if out[-1].features == "auto":
            raise ConfigError(f"{where} {key}.features: 'auto' takes data columns the model "
                              "cannot know; name the features the model reads")
    cfg = Config(tables=out)
    violation = first_violation(cfg)
    try:
        if violation is not None:
            raise ConfigError(violation)
        validate_tables(cfg)
    except ConfigError as e:
        raise ConfigError(f"{where} {e}") from None
    return out
