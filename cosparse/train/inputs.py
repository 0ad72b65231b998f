"""A model's inputs: the readers it trains and evaluates on.

Without ``features.spec`` they are the data reader's own (``make_reader``). With it, the model is
a consumer of the feature registry: its features are resolved (pinned versions checked), its
tables take the sparse features that feed them, and the batches are extracted from the raw
columns of ``data`` by the feature platform, or read back from ``features.materialized``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cosparse.config import ColumnsConfig, Config, ConfigError, DataConfig
from cosparse.config.model import validate_model
from cosparse.data import make_reader
from cosparse.data.reader import Reader
from cosparse.data.split import Split

if TYPE_CHECKING:  # the feature platform is imported only by runs that use it
    from cosparse.features import FeatureSet, RawSource


# What the data workers' fork server imports before any fork, so that workers start warm with the
# code of the layers above data: the feature extractor and B's worker side. One tuple for every
# stream of the process: whichever stream starts the (shared) fork server decides.
WORKER_PRELOAD = ("cosparse.features.preload", "cosparse.supply.collaborative.worker")


@dataclass
class ModelInputs:
    """The config with its tables' features resolved, and the train and eval readers."""

    cfg: Config
    train: Reader
    eval: Reader


def load_registry(cfg: Config) -> FeatureSet:
    """The feature registry of ``features.spec``, checked against the raw columns of ``data``
    (unless the features come from a materialization); spec errors become config errors.
    Pinned versions are checked for the consumers this run trains, when they are resolved."""
    from cosparse.features import FeatureSpecError, load_spec

    try:
        registry = load_spec(cfg.features.spec, check_pins=False)  # type: ignore[arg-type]
        if not cfg.features.materialized:
            registry.check_source(raw_source(cfg.data, "train").columns)
        return registry
    except FeatureSpecError as e:
        raise ConfigError(f"features.spec: {cfg.features.spec}: {e}") from None


def raw_source(data: DataConfig, split: Split) -> RawSource:
    """The raw columns of ``data`` for the feature platform (and ``data.columns``)."""
    from cosparse.features import CriteoRawSource, EventLogRawSource, ParquetRawSource

    cols = data.columns or ColumnsConfig()
    if data.reader == "criteo_tsv":
        return CriteoRawSource(data.path, data.batch_size, split, data.eval_fraction,
                               data.on_bad_record)
    if data.reader == "csv":
        from cosparse.features.csv_source import CsvRawSource

        return CsvRawSource(data.path, data.batch_size, split, data.eval_fraction,  # type: ignore[arg-type]
                            data.on_bad_record, data.csv, dict(data.schema), cols.label,
                            cols.drop)
    if data.reader == "parquet":
        return ParquetRawSource(data.path, data.batch_size, split, data.eval_fraction,  # type: ignore[arg-type]
                                data.on_bad_record, cols.label, exclude=cols.drop)
    if data.reader == "taobao_events":
        return EventLogRawSource(data.path, data.batch_size, split, data.eval_fraction,
                                 data.on_bad_record, data.events)
    raise ConfigError(f"data.reader: the feature platform extracts from the raw columns of "
                      f"'criteo_tsv', 'csv', 'parquet' or 'taobao_events', not '{data.reader}'")


def consumer_features(cfg: Config, registry: FeatureSet) -> tuple[Config, list[str], list[str]]:
    """(config with every table's features, sparse features, dense features) of the consumer
    ``features.consumer``. A table without features takes the consumer's features that feed it;
    a consumed sparse feature no table serves, or a table feature the consumer does not
    consume, is an error naming both."""
    name = cfg.features.consumer
    if name is None:
        raise ConfigError("features.consumer: a run with features.spec names the registry "
                          "consumer it trains")
    from cosparse.features import FeatureSpecError, require_fitted

    try:
        sparse, dense = registry.consumer_keys(name)
    except FeatureSpecError as e:
        raise ConfigError(f"features.consumer: {e}") from None
    try:
        require_fitted(registry, cfg.features.spec, sparse + dense)  # type: ignore[arg-type]
    except FeatureSpecError as e:
        raise ConfigError(f"features.spec: {e}") from None
    specs = registry.features
    tables = []
    for i, t in enumerate(cfg.tables):
        feats = list(t.features) or [f for f in sparse if specs[f].table == t.name]
        for f in feats:
            if f not in sparse:
                raise ConfigError(f"tables[{i}].features: '{f}' is not a sparse feature that "
                                  f"consumer '{name}' consumes ({', '.join(sparse)})")
        tables.append(dataclasses.replace(t, features=feats))
    served = {f for t in tables for f in t.features}
    for f in sparse:
        if f not in served:
            raise ConfigError(f"tables: feature '{f}' of consumer '{name}' feeds table "
                              f"'{specs[f].table}', which no table of the config declares")
    for i, t in enumerate(tables):
        if not t.features:
            raise ConfigError(f"tables[{i}].features: consumer '{name}' feeds table "
                              f"'{t.name}' no feature")
    return dataclasses.replace(cfg, tables=tables), sparse, dense


def featurized_reader(cfg: Config, registry: FeatureSet, sparse: list[str], dense: list[str],
                      split: Split) -> Reader:
    """Batches of ``sparse`` and ``dense`` features, extracted or read back."""
    from cosparse.features import FeatureReader, FeatureSpecError, MaterializedReader

    d = cfg.data
    try:
        if cfg.features.materialized:
            return MaterializedReader(cfg.features.materialized, registry, sparse, dense,
                                      d.batch_size, split, d.eval_fraction, source_path=d.path)
        return FeatureReader(raw_source(d, split), registry, sparse, dense)
    except FeatureSpecError as e:
        raise ConfigError(f"features: {e}") from None


def column_inputs(cfg: Config) -> ModelInputs:
    """The readers of ``data.columns`` (no spec), with ``features: auto`` resolved: such a
    table takes every ID column no other table names."""
    from cosparse.features.column_map import ColumnMapReader

    cols = cfg.data.columns or ColumnsConfig()
    train = ColumnMapReader(raw_source(cfg.data, "train"), cols)
    claimed = {f for t in cfg.tables if t.features != "auto" for f in t.features}
    rest = [f for f in train.keys if f not in claimed]
    tables = [dataclasses.replace(t, features=rest) if t.features == "auto" else t
              for t in cfg.tables]
    for i, t in enumerate(tables):
        if not t.features:
            raise ConfigError(f"tables[{i}].features: 'auto' finds no ID column that no other "
                              f"table takes (the data's: {', '.join(train.keys) or 'none'})")
    cfg = dataclasses.replace(cfg, tables=tables)
    validate_model(cfg)  # (its feature pairs were not checkable before)
    return ModelInputs(cfg, train, ColumnMapReader(raw_source(cfg.data, "eval"), cols))


def model_inputs(cfg: Config) -> ModelInputs:
    """The readers of a single-model config."""
    if not cfg.features.spec:
        if cfg.features.materialized:
            raise ConfigError("features.materialized: reading materialized features needs "
                              "features.spec (the versions it must match)")
        if cfg.data.reader == "csv" or cfg.data.columns is not None:
            return column_inputs(cfg)
        return ModelInputs(cfg, make_reader(cfg.data, "train"), make_reader(cfg.data, "eval"))
    registry = load_registry(cfg)
    cfg, sparse, dense = consumer_features(cfg, registry)
    return ModelInputs(cfg, featurized_reader(cfg, registry, sparse, dense, "train"),
                       featurized_reader(cfg, registry, sparse, dense, "eval"))


def check_table_features(cfg: Config, reader: Reader) -> None:
    """Every feature a table reads is one the training reader produces (else a ConfigError
    naming the table, the feature and what the reader has)."""
    keys = set(reader.keys)
    source = (f"feature consumer '{cfg.features.consumer}'" if cfg.features.spec
              else f"data.reader '{cfg.data.reader}'")
    for i, t in enumerate(cfg.tables):
        for f in t.features:
            if f not in keys:
                raise ConfigError(
                    f"tables[{i}].features: feature '{f}' is not produced by {source} "
                    f"(it has {', '.join(reader.keys)})"
                )
