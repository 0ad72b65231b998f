"""The ``EmbeddingBagCollection``s of a user's model, found by type (as TorchRec's
``DistributedModelParallel`` finds its sharded modules): a two-tower model may hold one per
tower. One engine serves them all: the trainer places every collection on the same embedding
collection, which looks up every table once per batch (``Batch.looked_up``), and each
collection returns its own features.

A table belongs to one collection, and a feature to one table: a second collection naming
either is refused with both collections' paths.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from cosparse.config import ConfigError, TableConfig
from cosparse.nn.embedding_bags import EmbeddingBagCollection


class Collections:
    """The model's collections by path, in the order ``named_modules`` visits them."""

    def __init__(self, model: nn.Module) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"cosparse.Trainer(model, ...): model must be a torch.nn.Module, "
                            f"not a {type(model).__name__}")
        self.found: list[tuple[str, EmbeddingBagCollection]] = [
            (name, m) for name, m in model.named_modules()
            if isinstance(m, EmbeddingBagCollection)]
        if not self.found:
            raise ConfigError(f"model: {type(model).__name__} holds no "
                              "cosparse.EmbeddingBagCollection; its sparse features are looked "
                              "up through one")
        self.tables: list[TableConfig] = _joined_tables(self.found)

    @property
    def paths(self) -> list[str]:
        return [path for path, _ in self.found]

    @property
    def modules(self) -> list[EmbeddingBagCollection]:
        return [m for _, m in self.found]

    @property
    def placed(self) -> bool:
        return any(m.placed for m in self.modules)

    def place(self, engine: nn.Module | None) -> None:
        """Place every collection on ``engine`` (None: unplace them)."""
        for m in self.modules:
            m.place(engine)

    @contextmanager
    def dry(self) -> Iterator[None]:
        """Every lookup gives zeros meanwhile (a dry forward: nothing is looked up)."""
        for m in self.modules:
            m._dry = True
        try:
            yield
        finally:
            for m in self.modules:
                m._dry = False


def _where(path: str) -> str:
    return repr(path or "<the model itself>")


def _joined_tables(found: list[tuple[str, EmbeddingBagCollection]]) -> list[TableConfig]:
    """Every collection's tables, in order; a table or feature in two collections is refused."""
    table_at: dict[str, str] = {}
    feature_at: dict[str, str] = {}
    out: list[TableConfig] = []
    for path, collection in found:
        for t in collection.tables:
            if t.name in table_at:
                raise ConfigError(
                    f"model: table '{t.name}' is in the EmbeddingBagCollections "
                    f"{_where(table_at[t.name])} and {_where(path)}; a table belongs to one "
                    "collection (rename one, or share the collection)")
            table_at[t.name] = path
            for f in t.features:
                if f in feature_at:
                    raise ConfigError(
                        f"model: feature '{f}' is read by the EmbeddingBagCollections "
                        f"{_where(feature_at[f])} and {_where(path)}; a feature is looked up "
                        "by one table (read it from one collection)")
                feature_at[f] = path
            out.append(t)
    return out
