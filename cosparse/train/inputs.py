"""A model's inputs: the readers it trains and evaluates on.

Without ``features.spec`` they are the data reader's own (``make_reader``). With it, the model is
a consumer of the feature registry: its features are resolved (pinned versions checked), its
tables take the sparse features that feed them, and the batches are extracted from the raw
columns of ``data`` by the feature platform, or read back from ``features.materialized``.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cosparse.config import (
    ColumnsConfig,
    Config,
    ConfigError,
    DataConfig,
    ShuffleConfig,
    SplitConfig,
)
from cosparse.config.model import validate_model
from cosparse.data.reader import Reader
from cosparse.data.split import Split
from cosparse.data.uniform_negatives import NEGATIVE
from cosparse.train.eval_file import eval_file_line, file_readers
from cosparse.train.task_classes import task_class_notes

if TYPE_CHECKING:  # the feature platform is imported only by runs that use it
    from cosparse.features import FeatureSet, RawSource


# What the data workers' fork server imports before any fork, so that workers start warm with the
# code of the layers above data: the feature extractor and B's worker side. One tuple for every
# stream of the process: whichever stream starts the (shared) fork server decides.
WORKER_PRELOAD = ("cosparse.features.preload", "cosparse.supply.collaborative.worker")


@dataclass
class ModelInputs:
    """The config with its tables' features resolved, the train and eval readers, and what
    the run logs of them at start-up."""

    cfg: Config
    train: Reader
    eval: Reader
    notes: list[str] = field(default_factory=list)


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


def _table_source(data: DataConfig, split: Split, batch_size: int, rows: Any = None,
                  shuffle: ShuffleConfig | None = None) -> RawSource:
    """A csv, libsvm or parquet source of ``data``'s columns (all rows' when ``rows`` is
    None)."""
    from cosparse.features import ParquetRawSource

    cols = data.columns or ColumnsConfig()
    label = None if cols.labels else cols.label  # (several tasks: read as columns, targets.py)
    if data.reader == "libsvm":
        from cosparse.features.libsvm_source import LibsvmRawSource

        return LibsvmRawSource(data.path, batch_size, split, 0.0, data.on_bad_record,  # type: ignore[arg-type]
                               data.libsvm.format, cols.label, cols.drop, rows, shuffle)
    if data.reader == "csv":
        from cosparse.features.csv_source import CsvRawSource

        return CsvRawSource(data.path, batch_size, split, 0.0, data.on_bad_record,  # type: ignore[arg-type]
                            data.csv, dict(data.schema), label, cols.drop, rows, shuffle)
    return ParquetRawSource(data.path, batch_size, split, 0.0, data.on_bad_record,  # type: ignore[arg-type]
                            label, exclude=cols.drop, rows=rows, shuffle=shuffle)


# one pass per process over the columns a split needs: (row numbers, eval mask, the line,
# each task's 0/1 labels on the eval side)
_SPLITS: dict[str, tuple[Any, Any, str, dict[str, Any]]] = {}


def split_rows(data: DataConfig, split: Split) -> tuple[Any, str]:
    """(the rows of ``split``, the start-up line saying both sides' rows and labels) of
    ``data.split`` (default: the last ``data.eval_fraction`` by position)."""
    from cosparse.features import row_split

    s, key = _split_key(data)
    if key not in _SPLITS:
        tasks = data.columns.labels if data.columns else {}
        rows, mask, labels, bad, marks = row_split.split_mask(
            _table_source(data, "train", 1 << 16), s, data.eval_fraction, tasks)
        several = bool(tasks)  # (then the split's labels are zeros: each task's are checked
        # by the objective's kinds, task_classes)
        row_split.check_sides(labels, mask, s, data.allow_one_class_eval or several)
        line = row_split.summary(None if several else labels, mask, s)
        if bad:
            line += f"; {bad:,} bad records on neither side (on_bad_record: skip)"
        if not several and mask.any() and labels[mask].min() == labels[mask].max():
            line += "; warning: the eval side has one label only (AUC undefined)"
        _SPLITS[key] = (rows, mask, line, {t: v[mask] for t, v in marks.items()})
    rows, mask, line, _ = _SPLITS[key]
    return (rows[mask] if split == "eval" else rows[~mask]), line


def split_task_labels(data: DataConfig) -> dict[str, Any]:
    """Each task's 0/1 labels on the eval side of the split ``split_rows`` made (NaN where a
    value maps to neither)."""
    key = _split_key(data)[1]
    return _SPLITS[key][3] if key in _SPLITS else {}


def _split_key(data: DataConfig) -> tuple[SplitConfig, str]:
    s = data.split or SplitConfig(eval_fraction=data.eval_fraction)
    return s, repr((data.path, data.reader, data.csv, data.schema, data.columns, s,
                    data.on_bad_record))


def raw_source(data: DataConfig, split: Split) -> RawSource:
    """The raw columns of ``data`` for the feature platform (and ``data.columns``)."""
    from cosparse.features import CriteoRawSource, EventLogRawSource

    if data.reader == "criteo_tsv" and data.eval_path is not None:  # a file each
        return CriteoRawSource(data.eval_path if split == "eval" else data.path,
                               data.batch_size, "train", 0.0, data.on_bad_record,
                               None if split == "eval" else data.shuffle)
    if data.reader == "criteo_tsv":
        return CriteoRawSource(data.path, data.batch_size, split, data.eval_fraction,
                               data.on_bad_record, data.shuffle)
    if data.reader in ("csv", "parquet", "libsvm") and data.eval_path is not None:  # a file each
        if split == "eval":
            return _table_source(dataclasses.replace(data, path=data.eval_path), "train",
                                 data.batch_size)
        return _table_source(data, split, data.batch_size, None, data.shuffle)
    if data.reader in ("csv", "parquet", "libsvm"):
        return _table_source(data, split, data.batch_size, split_rows(data, split)[0],
                             data.shuffle)
    if data.reader == "taobao_events":
        return EventLogRawSource(data.path, data.batch_size, split, data.eval_fraction,
                                 data.on_bad_record, data.events, data.shuffle)
    raise ConfigError(f"data.reader: the feature platform extracts from the raw columns of "
                      f"'criteo_tsv', 'csv', 'libsvm', 'parquet' or 'taobao_events', not "
                      f"'{data.reader}'")


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
    regression = _regression_tasks(cfg)
    bad = cfg.data.on_bad_record
    train = ColumnMapReader(raw_source(cfg.data, "train"), cols, regression, bad)
    cfg = _auto_features(cfg, train)
    eval_source = raw_source(cfg.data, "eval")
    line = (eval_file_line(cfg.data, train.source, eval_source) if cfg.data.eval_path
            else split_rows(cfg.data, "train")[1])  # (the eval file checked before it is read)
    notes = [line, *task_class_notes(cfg, split_task_labels(cfg.data))]
    return ModelInputs(cfg, train, ColumnMapReader(eval_source, cols, regression, bad), notes)


def _auto_features(cfg: Config, train: Reader) -> Config:
    """``cfg`` with its ``features: auto`` tables given every ID column of ``train`` that no
    other table names (then the model's feature rules checked)."""
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
    return cfg


def negatives_in_tables(cfg: Config, train: Reader) -> Config:
    """``cfg`` with each uniform negative's feature (``neg{j}_<key>``,
    ``data.events.uniform_negatives``) in the table of its item's ``<key>``, unless a table
    names it."""
    claimed = {f for t in cfg.tables for f in t.features}
    item_of = {f: m.group(2) for f in train.keys
               if (m := NEGATIVE.fullmatch(f)) is not None and f not in claimed}
    if not item_of:
        return cfg
    tables = [dataclasses.replace(t, features=[
        *t.features, *(f for f, key in item_of.items() if key in t.features)])
        for t in cfg.tables]
    return dataclasses.replace(cfg, tables=tables)


def stream_file_reader(data: DataConfig, path: str) -> Reader:
    """The reader of one file of a stream (``data.stream``): all its rows, for training, by
    ``data.reader`` with ``data.columns`` (Parquet without them: the Criteo columns)."""
    if data.reader == "parquet" and data.columns is None:
        from cosparse.data.parquet import ParquetReader

        return ParquetReader(path, data.batch_size, "train", 0.0, data.on_bad_record,
                             data.shuffle)
    from cosparse.features.column_map import ColumnMapReader

    one = dataclasses.replace(data, path=path, stream=None)
    return ColumnMapReader(_table_source(one, "train", data.batch_size, None, data.shuffle),
                           data.columns or ColumnsConfig())


def stream_inputs(cfg: Config) -> ModelInputs:
    """The reader of ``data.stream`` (it waits for the first complete file, which fixes the
    features). It trains and evaluates alike: a stream evaluates each batch before it trains
    on it (progressive validation), never a split of its own."""
    from cosparse.data.stream import StreamReader

    st = cfg.data.stream
    assert st is not None
    wait = st.idle_timeout_s or cfg.train.stall_timeout_s
    train = StreamReader(st, cfg.data.batch_size, functools.partial(stream_file_reader, cfg.data),
                         first_wait_s=wait)
    if cfg.data.reader == "csv" or cfg.data.columns is not None:
        cfg = _auto_features(cfg, train)
    return ModelInputs(cfg, train, train, [
        f"data.stream: watching {st.watch} for '{st.pattern}' (first file {train.first_file}); "
        f"progressive validation over the last {st.eval_window_rows:,} rows"])


def interaction_inputs(cfg: Config) -> ModelInputs:
    """The readers of ``reader: interactions`` (no feature spec)."""
    if cfg.features.spec:
        raise ConfigError("features.spec: reader interactions builds its own features (user, "
                          "item, item features and their histories); drop the spec")
    from cosparse.features.interaction_log import interactions_reader

    regression = frozenset(_regression_tasks(cfg))
    train = interactions_reader(cfg.data, "train", regression)
    eval_ = interactions_reader(cfg.data, "eval", regression)
    if any(t.features == "auto" for t in cfg.tables):  # (user, item, its columns, histories)
        cfg = _auto_features(cfg, train)
    cfg = negatives_in_tables(cfg, train)
    return ModelInputs(cfg, train, eval_, [train.describe(), eval_.describe(),
                                           *task_class_notes(cfg, eval_.task_labels())])


def _regression_tasks(cfg: Config) -> set[str]:
    return {n for n, t in (cfg.objective.tasks.items() if cfg.objective else ())
            if t.kind == "regression"}


def model_inputs(cfg: Config) -> ModelInputs:
    """The readers of a single-model config."""
    if cfg.data.stream is not None:
        return stream_inputs(cfg)
    if cfg.data.reader == "interactions":
        return interaction_inputs(cfg)
    if not cfg.features.spec:
        if cfg.features.materialized:
            raise ConfigError("features.materialized: reading materialized features needs "
                              "features.spec (the versions it must match)")
        if cfg.data.reader in ("csv", "libsvm") or (cfg.data.columns is not None
                                                    and cfg.data.reader != "taobao_events"):
            return column_inputs(cfg)
        train, eval_ = file_readers(cfg.data)
        cfg = negatives_in_tables(cfg, train)
        tasks = getattr(eval_, "task_labels", dict)()  # (taobao_events: data.columns.labels)
        return ModelInputs(cfg, train, eval_, task_class_notes(cfg, tasks))
    registry = load_registry(cfg)
    cfg, sparse, dense = consumer_features(cfg, registry)
    notes = ([split_rows(cfg.data, "train")[1]]
             if cfg.data.reader in ("csv", "parquet", "libsvm") and not cfg.features.materialized
             and cfg.data.eval_path is None else [])
    return ModelInputs(cfg, featurized_reader(cfg, registry, sparse, dense, "train"),
                       featurized_reader(cfg, registry, sparse, dense, "eval"), notes)


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
