"""The ``data`` section: the reader, its batches, its files' columns and splits, and its rules
(the synthetic generators' own sections: ``synthetic.py``)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal

from cosparse.config.errors import ConfigError
from cosparse.config.eval_path import validate_eval_path
from cosparse.config.events import EventsConfig
from cosparse.config.labels import (
    LabelConfig,
    as_label,
    validate_event_labels,
    validate_label,
    validate_targets,
)
from cosparse.config.libsvm import LibsvmConfig
from cosparse.config.synthetic import SyntheticConfig

if TYPE_CHECKING:
    from cosparse.config.root import Config


@dataclass
class CsvConfig:
    """How ``reader: csv`` splits its lines: ``delimiter`` None is sniffed (``csv_dialect``);
    ``header: none`` (or false) reads line 1 as data, the columns ``names`` or f0, f1, ..."""

    delimiter: str | None = None
    header: bool | Literal["none"] = True
    names: list[str] | None = None  # the columns of a file without a header, in order
    null_values: list[str] = field(default_factory=lambda: ["", "NULL", "null", "NA", "\\N"])
    quote: str | None = '"'  # None: quotes are plain characters
    list_separator: str = "|"  # between the elements of a list<...> column
    infer_rows: int = 1000  # rows of the first file that the column types are inferred from

    def __post_init__(self) -> None:
        self.header = self.header is True  # "none": no header
        if self.names is not None and (self.header or len(set(self.names)) < len(self.names)):
            raise ConfigError("data.csv.names: names each column of a file without a header "
                              "once (set data.csv.header: none)")


ColumnType = Literal["int64", "uint64", "float32", "string", "list<int64>", "list<string>"]


TimeField = Literal["hour_of_day", "day_of_week", "day_of_month", "month", "days_since"]


@dataclass
class DatetimeColumn:
    """Calendar fields of one time column (the feature platform's ``datetime`` transform):
    ``format`` is a strptime format, ``unix_s``, ``unix_ms`` or ``iso8601``; each field of
    ``emit`` becomes the sparse feature ``<column>_<field>``; ``days_since`` counts from
    ``since`` (YYYY-MM-DD)."""

    format: str = "unix_s"
    emit: list[TimeField] = field(default_factory=lambda: ["hour_of_day", "day_of_week"])
    since: str | None = None


@dataclass
class ColumnsConfig:
    """Columns to model inputs without a feature spec (readers csv, libsvm; parquet when set):
    the label (``config.labels``: 0/1, or mapped to 0/1), dense columns (float, missing = 0),
    sparse columns (each value hashed, seeded by ``hash_seed`` and the column's name, to a 63-bit
    ID; ``auto``: every column not named elsewhere), sequences (lists, each element hashed), drops."""

    label: LabelConfig = field(default_factory=LabelConfig)  # YAML: a name or a mapping
    # several tasks' labels ({task: column or mapping}; objective.tasks names their kinds) and
    # the per-sample weight column: neither ever becomes a feature
    labels: dict[str, LabelConfig] = field(default_factory=dict)
    weight: str | None = None
    dense: list[str] = field(default_factory=list)
    sparse: list[str] | Literal["auto"] = "auto"
    sequence: list[str] = field(default_factory=list)
    drop: list[str] = field(default_factory=list)
    hash_seed: int = 0
    # time columns to calendar features (a column named here is not a sparse feature itself
    # unless data.columns.sparse lists it)
    datetime: dict[str, DatetimeColumn] = field(default_factory=dict)
    # reader interactions: who, what and when (None: the file order), and the item's own columns
    user: str | None = None
    item: str | None = None
    time: str | None = None
    # the time column's format (datetime transform formats): None reads numbers as they are
    # and text as ISO 8601
    time_format: str | None = None
    item_features: list[str] = field(default_factory=list)
    # columns that name one entity share its ID space: {cate: [hist_cate]} hashes hist_cate's
    # values with cate's seed, so one category is one ID in both (DIN's target and history)
    id_space: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:  # (code may give the label by its column's name)
        self.label = as_label(self.label)
        self.labels = {k: as_label(v) for k, v in self.labels.items()}

    def target_columns(self) -> list[str]:
        """The columns of ``labels`` and ``weight`` (never features)."""
        return [r.column for r in self.labels.values()] + ([self.weight] if self.weight else [])


@dataclass
class SplitConfig:
    """Which rows evaluate (``cosparse.features.row_split`` says how each ``by`` decides)."""

    by: Literal["position", "column", "time", "hash", "last_per_user"] = "position"
    eval_fraction: float | None = None  # position, time (without at), hash; None: data's
    column: str | None = None  # column: the eval flag; time, last_per_user: the time column
    at: int | float | str | None = None  # time: the first eval time (a number, or text in format)
    key: str | None = None  # hash, last_per_user: the user (or other) column
    seed: int = 0  # hash
    format: str | None = None  # the time column's datetime format (text columns: iso8601)


@dataclass
class NegativesConfig:
    """Sampled negatives of implicit feedback (``reader: interactions``): ``per_positive`` items
    per positive sample that its user had not interacted with by then, drawn uniformly from the
    items of the log or by their popularity; never part of any history."""

    YAML_NAMES: ClassVar[dict[str, str]] = {"from": "sample_from"}  # "from" is a keyword
    per_positive: int = 1
    eval_per_positive: int | None = None  # the eval split's (e.g. 99); None: per_positive
    sample_from: Literal["uniform", "popularity"] = "uniform"
    seed: int = 0


@dataclass
class ShuffleConfig:
    """Training rows in a seeded order: permuted within windows of ``buffer`` rows (rounded up
    to whole batches); ``cosparse.data.shuffle`` says how."""

    buffer: int = 65536
    seed: int = 0


@dataclass
class StreamConfig:
    """Train continuously on the files that arrive in ``watch`` (``cosparse.data.stream``): each
    file whose name matches ``pattern`` is taken once its size and mtime are unchanged over one
    poll, in arrival order (mtime, then name), and read by ``data.reader`` (csv or parquet).
    Evaluation is progressive validation: every batch is scored before it is trained on, over
    the most recent ``eval_window_rows`` rows."""

    watch: str = ""  # the directory to watch
    pattern: str = "*.parquet"  # a glob on the file names (never a hidden or .tmp name)
    poll_s: float = 1.0  # how often the directory is listed when nothing is ready
    # end the run cleanly when no new file is complete for this long; None: wait for files
    # until train.steps (an idle stream keeps the trainer's heartbeat alive)
    idle_timeout_s: float | None = None
    eval_window_rows: int = 100_000  # progressive validation over the most recent rows


@dataclass
class DataConfig:
    reader: Literal["synthetic", "criteo_tsv", "parquet", "taobao_events",
                    "synthetic_sequences", "csv", "interactions", "libsvm"] = "synthetic"
    path: str | None = None
    batch_size: int = 4096
    workers: int = 0
    queue_depth: int = 4
    on_bad_record: Literal["fail", "skip"] = "fail"
    eval_fraction: float = 0.2
    eval_path: str | None = None  # evaluate on this file (all of data.path trains): no split
    # evaluation scores this many samples per forward at least (consecutive eval batches are
    # joined); None: max(batch_size, 1024). Training batches are not affected.
    eval_batch_size: int | None = None
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    events: EventsConfig = field(default_factory=EventsConfig)
    csv: CsvConfig = field(default_factory=CsvConfig)
    libsvm: LibsvmConfig = field(default_factory=LibsvmConfig)
    schema: dict[str, ColumnType] = field(default_factory=dict)  # column types over inferred ones
    # the columns' roles without a feature spec: needed by parquet files of other columns than
    # Criteo's; csv reads every column not named elsewhere as sparse when it is not given
    columns: ColumnsConfig | None = None
    # rows of reader csv or parquet (with data.columns or a spec) to evaluate on; None: the last
    # data.eval_fraction of them
    split: SplitConfig | None = None
    allow_one_class_eval: bool = False  # an eval side of one label: a warning, not an error
    shuffle: ShuffleConfig | None = None  # None: training rows in file order
    negatives: NegativesConfig | None = None  # reader interactions: sampled negatives
    stream: StreamConfig | None = None  # None: the finite data of data.path


def validate_data(cfg: Config) -> None:
    """A file reader has a path, bags are not inverted, and the labels are known behaviours."""
    d = cfg.data
    _validate_stream(cfg)
    validate_eval_path(d)
    if d.reader not in ("synthetic", "synthetic_sequences") and not d.path and d.stream is None:
        raise ConfigError(f"data.path: reader '{d.reader}' needs a path")
    s = d.synthetic
    if s.bag_max < s.bag_min:
        raise ConfigError("data.synthetic.bag_min/bag_max: need 0 <= bag_min <= bag_max")
    _validate_csv(d)
    _validate_interactions(d)
    _validate_split(d)
    _validate_shuffle(cfg)
    cols = d.columns
    validate_event_labels(d.reader, d.events.positive, cols.labels if cols else {},
                          cols is None or cols == ColumnsConfig(labels=cols.labels))


def _validate_csv(d: DataConfig) -> None:
    c = d.csv
    for key, ch in (("delimiter", c.delimiter), ("quote", c.quote),
                    ("list_separator", c.list_separator)):
        if ch is not None and (len(ch) != 1 or ch in "\n\r"):
            raise ConfigError(f"data.csv.{key}: one character other than a newline, got {ch!r}")
    if c.quote is not None and c.quote in (c.delimiter, c.list_separator):
        raise ConfigError(f"data.csv.quote: {c.quote!r} is also the delimiter or list separator")
    if d.schema and d.reader != "csv":
        raise ConfigError(f"data.schema: types the columns of reader 'csv', not '{d.reader}' "
                          "(Parquet files carry their own types)")
    cols = d.columns
    if cols is None:
        return
    if d.reader not in ("csv", "parquet", "interactions", "libsvm", "taobao_events"):
        raise ConfigError(f"data.columns: maps the columns of readers 'csv', 'parquet', "
                          f"'interactions', 'libsvm' and 'taobao_events' (labels only), not "
                          f"'{d.reader}'")
    validate_label(cols.label, d.reader)
    for col, dt in cols.datetime.items():
        key = f"data.columns.datetime.{col}"
        if not dt.emit:
            raise ConfigError(f"{key}.emit: name one field or more")
        if "days_since" in dt.emit:
            try:
                datetime.date.fromisoformat(str(dt.since))
            except ValueError:
                raise ConfigError(f"{key}.since: days_since counts from a YYYY-MM-DD date, got "
                                  f"{dt.since!r}") from None
        if col == cols.label.column or col in cols.drop:
            raise ConfigError(f"{key}: column '{col}' is the label or dropped")
    named: dict[str, str] = {cols.label.column: "label"}
    if cols.labels or cols.weight:
        named = {**({} if cols.labels else named),
                 **validate_targets(d.reader, cols.labels, cols.weight)}
    roles = [("dense", cols.dense), ("sequence", cols.sequence), ("drop", cols.drop)]
    if cols.sparse != "auto":
        roles.insert(1, ("sparse", cols.sparse))
    for role, names in roles:
        for n in names:
            if n in named:
                raise ConfigError(f"data.columns.{role}: column '{n}' is already "
                                  f"{'the' if named[n] == 'label' else 'in'} {named[n]}")
            named[n] = role
    _validate_id_space(d.reader, cols, named)


def _validate_id_space(reader: str, cols: ColumnsConfig, named: dict[str, str]) -> None:
    """data.columns.id_space: groups of ID columns, each column in one group at most."""
    if not cols.id_space:
        return
    if reader == "interactions":
        raise ConfigError("data.columns.id_space: reader interactions builds its histories from "
                          "its item column, so they share the item's IDs already")
    seen: dict[str, str] = {}
    for first, others in cols.id_space.items():
        for n in [first, *others]:
            if n in seen:
                raise ConfigError(f"data.columns.id_space.{first}: column '{n}' is already in "
                                  f"the ID space of '{seen[n]}'")
            if named.get(n) in ("label", "dense", "drop"):
                raise ConfigError(f"data.columns.id_space.{first}: column '{n}' is "
                                  f"{'the' if named[n] == 'label' else 'in'} {named[n]}, not an "
                                  "ID column")
            seen[n] = first


def _validate_stream(cfg: Config) -> None:
    d, st = cfg.data, cfg.data.stream
    if st is None:
        return
    if d.reader not in ("csv", "parquet"):
        raise ConfigError(f"data.stream: streams the files of reader csv or parquet, not "
                          f"'{d.reader}'")
    if not st.watch:
        raise ConfigError("data.stream.watch: name the directory whose new files to train on")
    if d.path:
        raise ConfigError("data.stream: the files come from data.stream.watch; drop data.path")
    if not st.pattern or "/" in st.pattern:
        raise ConfigError(f"data.stream.pattern: a glob on file names in the watched directory "
                          f"(e.g. '*.parquet'), got {st.pattern!r}")
    if d.split is not None:
        raise ConfigError("data.split: a stream evaluates by progressive validation (each batch "
                          "scored before it trains, data.stream.eval_window_rows); drop it")
    if cfg.features.spec or cfg.features.materialized or cfg.models:
        raise ConfigError("data.stream: streams train one model on data.columns (or Criteo "
                          "columns); features.spec, features.materialized and models are not "
                          "supported with it")


_SPLIT_NEEDS = {"column": ("column",), "time": ("column",), "hash": ("key",),
                "last_per_user": ("key",)}


def _validate_split(d: DataConfig) -> None:
    s = d.split
    if s is None:
        return
    if d.reader == "interactions":
        if s.by not in ("position", "last_per_user"):
            raise ConfigError(f"data.split.by: reader interactions splits by position (the last "
                              f"events in time) or last_per_user, not {s.by}")
        return
    if d.reader not in ("csv", "parquet", "libsvm") or (d.reader, d.columns) == ("parquet", None):
        raise ConfigError(f"data.split: splits the rows of reader csv or libsvm, or parquet "
                          f"with data.columns; reader '{d.reader}' splits by position "
                          "(data.eval_fraction)")
    for key in _SPLIT_NEEDS.get(s.by, ()):
        if not getattr(s, key):
            raise ConfigError(f"data.split.{key}: by {s.by} needs it")
    if s.at is not None and s.by != "time":
        raise ConfigError(f"data.split.at: only by time cuts at a time, not by {s.by}")
    if s.by == "time" and s.at is not None and s.eval_fraction is not None:
        raise ConfigError("data.split: by time takes at or eval_fraction, not both")
    if s.by in ("column", "last_per_user") and s.eval_fraction is not None:
        raise ConfigError(f"data.split.eval_fraction: by {s.by} decides each row itself")


def _validate_shuffle(cfg: Config) -> None:
    d = cfg.data
    if d.shuffle is None:
        return
    if d.reader in ("synthetic", "synthetic_sequences"):
        raise ConfigError(f"data.shuffle: reader '{d.reader}' draws every row independently "
                          "already; there is no file order to shuffle")
    if d.reader == "taobao_events" and d.events.shuffle:
        raise ConfigError("data.shuffle: data.events.shuffle permutes the whole split already; "
                          "set data.events.shuffle: false to shuffle within a buffer")
    if cfg.features.materialized:
        raise ConfigError("data.shuffle: features.materialized are read back in the order they "
                          "were written; shuffle when materializing instead")


_INTERACTION_KEYS = ("user", "item", "time", "time_format", "item_features")


def _validate_interactions(d: DataConfig) -> None:
    cols = d.columns
    if d.reader != "interactions":
        named = [k for k in _INTERACTION_KEYS if cols is not None and getattr(cols, k)]
        if named:
            raise ConfigError(f"data.columns.{named[0]}: names a column of reader "
                              f"'interactions', not '{d.reader}'")
        if d.negatives is not None:
            raise ConfigError(f"data.negatives: samples negatives for reader 'interactions', "
                              f"not '{d.reader}'")
        if d.events.layout != "rows":
            raise ConfigError(f"data.events.layout: a layout of reader 'interactions', not "
                              f"'{d.reader}'")
        return
    if d.events.layout == "user_items":
        if cols is not None and (cols.time or cols.item_features or cols.labels):
            raise ConfigError("data.columns: a user_items file has users and items only (its "
                              "order is the time; no label columns for data.columns.labels)")
        return
    for k in ("user", "item"):
        if cols is None or not getattr(cols, k):
            raise ConfigError(f"data.columns.{k}: reader interactions needs the {k} column")
    assert cols is not None
    if cols.time_format is not None and not cols.time:
        raise ConfigError("data.columns.time_format: formats data.columns.time; name it")
    seen: dict[str, str] = {}
    for role in ("user", "item", "time"):
        name = getattr(cols, role)
        if name in seen:
            raise ConfigError(f"data.columns.{role}: column '{name}' is already the "
                              f"{seen[name]}")
        if name:
            seen[name] = role
    for f in cols.item_features:
        if f in seen:
            raise ConfigError(f"data.columns.item_features: column '{f}' is already the "
                              f"{seen[f]}")
