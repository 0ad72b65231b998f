"""Typed configuration (data, model, tables, store, supply, train) loaded from YAML, with validation.

Every section is a dataclass. Unknown keys, wrong types and inconsistent settings raise
``ConfigError`` naming the dotted key (``tables[0].optimizer.kind``) at start-up.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from cosparse.config_bounds import first_violation


class ConfigError(ValueError):
    """A configuration problem, with the dotted key that causes it."""


_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_bytes(value: int | str, key: str) -> int:
    """``2GiB`` / ``512MB`` / ``1048576`` -> bytes."""
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*", str(value))
    if not m or m.group(2).upper() not in _SIZE_UNITS:
        raise ConfigError(f"{key}: cannot read {value!r} as a size (use e.g. 2GiB, 512MB, 1048576)")
    size = float(m.group(1)) * _SIZE_UNITS[m.group(2).upper()]
    if not size < 2**63:
        raise ConfigError(f"{key}: {value!r} is too large")
    return int(size)


# ---------------------------------------------------------------------------------------------
@dataclass
class SyntheticConfig:
    """Zipf(alpha) synthetic click data; the defaults are Criteo-like (13 dense, 26 categorical)."""

    num_features: int = 26
    feature_prefix: str = "C"
    num_dense: int = 13
    vocab_size: int = 1_000_000
    alpha: float = 1.05
    bag_min: int = 1
    bag_max: int = 1
    seed: int = 0
    num_batches: int = 1_000_000
    eval_batches: int = 4


@dataclass
class SequenceSyntheticConfig:
    """Synthetic long behaviour sequences (reader ``synthetic_sequences``): Zipf items, every
    history exactly ``seq_len`` long, labels learnable from the target and the history."""

    seq_len: int = 1000
    vocab_size: int = 100_000
    num_cates: int = 1000
    num_users: int = 10_000
    alpha: float = 1.05
    seed: int = 0
    num_batches: int = 1_000_000
    eval_batches: int = 4


@dataclass
class EventsConfig:
    """Behaviour-sequence samples from an event log (reader ``taobao_events``): one sample per
    target event, with the user's most recent ``max_len`` events strictly before it."""

    max_len: int = 100
    min_history: int = 1
    positive: list[str] = field(default_factory=lambda: ["buy"])  # behaviours labelled 1
    shuffle: bool = True  # train samples in a seeded random order (else by time)
    seed: int = 0
    synthetic: SequenceSyntheticConfig = field(default_factory=SequenceSyntheticConfig)


@dataclass
class DataConfig:
    reader: Literal["synthetic", "criteo_tsv", "parquet", "taobao_events",
                    "synthetic_sequences"] = "synthetic"
    path: str | None = None
    batch_size: int = 4096
    workers: int = 0
    queue_depth: int = 4
    on_bad_record: Literal["fail", "skip"] = "fail"
    eval_fraction: float = 0.2
    # evaluation scores this many samples per forward at least (consecutive eval batches are
    # joined); None: max(batch_size, 1024). Training batches are not affected.
    eval_batch_size: int | None = None
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    events: EventsConfig = field(default_factory=EventsConfig)


@dataclass
class OptimizerConfig:
    kind: Literal["sgd", "adagrad", "rowwise_adagrad", "adam"] = "rowwise_adagrad"
    lr: float = 0.01
    eps: float = 1e-8
    beta1: float = 0.9
    beta2: float = 0.999
    initial_accumulator: float = 0.0


@dataclass
class InitConfig:
    kind: Literal["uniform", "normal"] = "uniform"
    low: float = -0.05
    high: float = 0.05
    std: float = 0.01


@dataclass
class TableConfig:
    name: str = ""
    dim: int = 16
    features: list[str] = field(default_factory=list)
    pooling: Literal["sum", "mean", "none"] = "sum"  # none: every ID its own row (sequences)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    init: InitConfig = field(default_factory=InitConfig)
    seed: int = 0
    num_embeddings: int | None = None  # expected rows: sizes the first allocation, checks budget
    hash_size: int | None = None  # only when set: IDs are taken modulo this (fixed-size table)
    policy: Literal["lru", "lfu", "hotness"] | None = None  # overrides store.device.policy


@dataclass
class DenseOptimizerConfig:
    kind: Literal["adagrad", "sgd", "adam"] = "adagrad"
    lr: float = 0.01


@dataclass
class DINConfig:
    """DIN (Zhou et al. 2018): each ``pairs`` entry is [target feature, history feature]; the
    pairs' targets form the query and their histories the keys of one attention unit."""

    pairs: list[list[str]] = field(default_factory=list)
    attention: list[int] = field(default_factory=lambda: [64, 32])
    mlp: list[int] = field(default_factory=lambda: [128, 64])
    normalize: Literal["none", "softmax"] = "none"  # none: the paper's unnormalised weights


@dataclass
class ModelConfig:
    kind: Literal["dlrm", "deepfm", "dcn", "din"] = "dlrm"
    bottom: list[int] = field(default_factory=lambda: [64, 16])
    top: list[int] = field(default_factory=lambda: [64, 1])
    deep: list[int] = field(default_factory=lambda: [64, 32])  # DeepFM / DCN-v2 deep tower
    cross_layers: int = 2  # DCN-v2
    cross_rank: int | None = None  # DCN-v2 low-rank cross; None = full matrix
    din: DINConfig = field(default_factory=DINConfig)
    dense_optimizer: DenseOptimizerConfig = field(default_factory=DenseOptimizerConfig)


@dataclass
class TierConfig:
    """A tier's capacity, as ``budget_bytes`` (split across tables) or ``rows`` (per table)."""

    budget_bytes: int | str | None = None
    rows: int | None = None
    policy: Literal["lru", "lfu", "hotness"] = "hotness"


@dataclass
class HostTierConfig(TierConfig):
    policy: Literal["lru", "lfu", "hotness"] = "lfu"
    spill: bool = False  # rows the host evicts go to the tier below: see spill_to
    spill_to: Literal["memory", "remote"] = "memory"  # an in-process store, or the PS (store.remote)


@dataclass
class RemoteConfig:
    """The parameter server: embedded shard processes, or running ones at ``endpoints``."""

    embedded: bool = True
    num_shards: int = 2
    endpoints: list[str] = field(default_factory=list)  # host:port per shard, in shard order
    # tcpstore: read the endpoints that shards announced (`ps serve --announce`) from the
    # TCPStore at `tcpstore`, or at torchrun's MASTER_ADDR:MASTER_PORT
    discovery: Literal["config", "tcpstore"] = "config"
    tcpstore: str | None = None
    data_dir: str | None = None  # embedded shards' snapshots (default: a temporary directory)
    timeout_s: float = 30.0  # a request not answered in this time fails, naming the shard
    heartbeat_s: float = 1.0
    auth_key: str | None = None  # HMAC shared-secret file (from `cosparse ps keygen`)
    max_rows: int | None = None  # embedded shards: each one's row budget (ps serve --max-rows)


@dataclass
class StoreConfig:
    """Where rows live. No device capacity: every row resident on the device (the reference)."""

    device: TierConfig = field(default_factory=TierConfig)
    host: HostTierConfig = field(default_factory=HostTierConfig)
    remote: RemoteConfig = field(default_factory=RemoteConfig)
    decay: float = 0.99  # per-batch decay of the hotness counts
    probe_batches: int = 4  # first batches read at start-up to size and check the tiers
    # Not exact by design, so off by default (and outside the exactness matrix):
    admit_after: int = 0  # an ID gets its own row after this many sightings (0/1: at once)
    ttl_steps: int = 0  # rows untouched this many batches are dropped from every tier (0: off)

    @property
    def tiered(self) -> bool:
        return self.device.rows is not None or self.device.budget_bytes is not None


@dataclass
class SupplyConfig:
    # resident: rows in the local tiers (all on the device without a device capacity);
    # ps-direct: architecture A, rows on the parameter server, pulled and pushed every step
    # collaborative: architecture B, data workers deliver the cold rows from the PS with the batch
    path: Literal["resident", "ps-direct", "collaborative"] = "resident"
    lookahead: int = 1  # plan and pin this many batches ahead on a background thread (0: inline)
    horizon: int = 0  # batches read beyond the lookahead whose rows eviction passes over
    # collaborative only:
    fallback: Literal["ps-direct"] | None = None  # on a run-time failure, the trainer pulls itself
    publish_every: int = 1  # steps between two publications of the resident filter
    publish_timeout_s: float = 30.0  # a filter request unserved this long is a failure
    max_stale_rate: float = 0.5  # stale drops / delivered rows (over 2000+ rows) above: failure
    filter_bits_per_row: int = 10  # resident-filter size per row of device + host capacity


@dataclass
class NetworkConfig:
    """Simulated links (one token bucket per link, shared by its sockets); None: unshaped."""

    link_mbps: float | None = None
    link_latency_ms: float = 0.0


@dataclass
class CheckpointConfig:
    dir: str | None = None
    every: int = 0
    keep: int = 2
    incremental: bool = False  # PS shards snapshot only the rows written since their last one


@dataclass
class TrainConfig:
    steps: int = 1000
    epochs: int = 1  # passes over a finite reader; `steps` caps the total
    seed: int = 0
    threads: int | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    log_every: int = 50
    eval_every: int = 0  # 0: evaluate at the end only
    metrics_json: str | None = None
    tensorboard_dir: str | None = None
    progress: bool = True
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    # a step whose loss is NaN or infinite: stop the run there with an error naming the step,
    # or skip the batch's updates (sparse and dense) and count it in `skipped_batches`
    on_nonfinite: Literal["stop", "skip_batch"] = "stop"
    # a wait whose other side (trainer, planner thread, data stream) makes no progress this long
    # raises an error naming both sides instead of hanging; 0 waits without bound
    stall_timeout_s: float = 300.0
    # debug (architecture A): before each batch trains, check the version of every row it uses
    # against the PS's (a PEEK per table and step); a stale copy stops the run, naming the table,
    # an ID and both versions
    check_versions: bool = False


@dataclass
class FeaturesConfig:
    """The unified feature platform: features come from a spec (the registry), computed from the
    raw columns of ``data`` (or read from a materialization), instead of the reader's own keys."""

    spec: str | None = None  # feature spec YAML: features, transforms, versions, consumers
    consumer: str | None = None  # a single-model run: the registry consumer this model is
    materialized: str | None = None  # read the features of this materialization (no recompute)


@dataclass
class ModelEntry:
    """One model of a multi-model run: a registry consumer with its own model and tables."""

    name: str = ""
    model: ModelConfig = field(default_factory=ModelConfig)
    tables: list[TableConfig] = field(default_factory=list)


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    tables: list[TableConfig] = field(default_factory=list)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    models: list[ModelEntry] = field(default_factory=list)  # several models from one extraction
    preset: Literal["resident", "arch-a", "arch-b"] | None = None
    store: StoreConfig = field(default_factory=StoreConfig)
    supply: SupplyConfig = field(default_factory=SupplyConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


# ---------------------------------------------------------------------------------------------
def _convert(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(a, value, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: {value!r} fits none of {tp}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__}")
        return [_convert(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        if isinstance(value, int) and abs(value) > 2**63:
            raise ConfigError(f"{key}: {value} is out of range")
        if not math.isfinite(value):
            raise ConfigError(f"{key}: expected a finite number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported type {tp}")


def from_dict(cls: type, data: Any, key: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys by their dotted name."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{key or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for k, v in data.items():
        full = f"{key}.{k}" if key else str(k)
        if k not in names:
            close = difflib.get_close_matches(str(k), names, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"unknown key '{full}'{hint}; known keys: {', '.join(names)}")
        kwargs[k] = _convert(hints[k], v, full)
    return cls(**kwargs)


def _validate_supply(cfg: Config) -> None:
    sp, host = cfg.supply, cfg.store.host
    if sp.path == "ps-direct" and (host.rows is not None or host.budget_bytes is not None
                                   or host.spill):
        raise ConfigError("store.host: supply.path 'ps-direct' keeps rows on the device cache "
                          "and the PS only; remove store.host")
    if sp.path != "collaborative":
        if sp.fallback is not None:
            raise ConfigError(f"supply.fallback: only supply.path 'collaborative' falls back "
                              f"(this run is '{sp.path}')")
        return
    if not cfg.store.tiered:
        raise ConfigError("store.device: supply.path 'collaborative' needs a device capacity "
                          "(store.device.budget_bytes or rows)")
    if host.rows is None and host.budget_bytes is None:
        raise ConfigError("store.host: supply.path 'collaborative' needs a bounded host tier "
                          "(store.host.rows or budget_bytes): the cold rows live on the PS")
    if not host.spill or host.spill_to != "remote":
        raise ConfigError("store.host.spill/spill_to: supply.path 'collaborative' writes host "
                          "victims to the PS: set spill: true and spill_to: remote")


def validate(cfg: Config) -> Config:
    """Range and cross-field checks. Raises ConfigError naming the offending key."""
    violation = first_violation(cfg)  # every numeric value in its range (config_bounds.BOUNDS)
    if violation is not None:
        raise ConfigError(violation)
    d = cfg.data
    if d.reader not in ("synthetic", "synthetic_sequences") and not d.path:
        raise ConfigError(f"data.path: reader '{d.reader}' needs a path")
    s = d.synthetic
    if s.bag_max < s.bag_min:
        raise ConfigError("data.synthetic.bag_min/bag_max: need 0 <= bag_min <= bag_max")
    if cfg.models:
        return _validate_models(cfg)
    if not cfg.tables:
        raise ConfigError("tables: at least one table is needed")
    seen_tables: set[str] = set()
    seen_features: dict[str, str] = {}
    for i, t in enumerate(cfg.tables):
        k = f"tables[{i}]"
        if not t.name:
            raise ConfigError(f"{k}.name: every table needs a name")
        if t.name in seen_tables:
            raise ConfigError(f"{k}.name: table '{t.name}' is declared twice")
        seen_tables.add(t.name)
        if t.dim <= 0:
            raise ConfigError(f"{k}.dim: must be positive")
        if not t.features and not cfg.features.spec:  # a spec fills them from its consumer
            raise ConfigError(f"{k}.features: table '{t.name}' has no features")
        for f in t.features:
            if f in seen_features:
                raise ConfigError(
                    f"{k}.features: feature '{f}' is already served by table '{seen_features[f]}'"
                )
            seen_features[f] = t.name
        if t.init.low > t.init.high:
            raise ConfigError(f"{k}.init.low: {t.init.low} is above {k}.init.high "
                              f"({t.init.high})")
    tr = cfg.train
    if tr.checkpoint.every and not tr.checkpoint.dir:
        raise ConfigError("train.checkpoint.dir: needed when train.checkpoint.every is set")
    for tier_name in ("device", "host"):
        tier = getattr(cfg.store, tier_name)
        key = f"store.{tier_name}"
        if tier.budget_bytes is not None and tier.rows is not None:
            raise ConfigError(f"{key}: give budget_bytes or rows, not both")
        if tier.budget_bytes is not None:
            tier.budget_bytes = parse_bytes(tier.budget_bytes, f"{key}.budget_bytes")
            if tier.budget_bytes <= 0:
                raise ConfigError(f"{key}.budget_bytes: must be positive")
    host = cfg.store.host
    if not cfg.store.tiered and (host.rows is not None or host.budget_bytes is not None or host.spill):
        raise ConfigError("store.host: a host tier needs a bounded device tier "
                          "(store.device.rows or store.device.budget_bytes)")
    if host.spill and host.spill_to == "remote" and cfg.store.ttl_steps:
        raise ConfigError("store.ttl_steps: the TTL does not reach rows on the PS "
                          "(store.host.spill_to: remote)")
    if cfg.store.ttl_steps and not cfg.store.tiered:
        raise ConfigError("store.ttl_steps: the TTL works on tiers; set store.device.rows or "
                          "store.device.budget_bytes")
    _validate_supply(cfg)
    if cfg.supply.path != "resident" or (host.spill and host.spill_to == "remote"):
        remote = cfg.store.remote
        if cfg.store.admit_after > 1 and cfg.supply.path != "resident":
            raise ConfigError(f"store.admit_after: not supported with supply.path '{cfg.supply.path}'")
        if not remote.embedded and remote.discovery == "config" and not remote.endpoints:
            raise ConfigError("store.remote.endpoints: needed when store.remote.embedded is false "
                              "(or set store.remote.discovery: tcpstore)")
        if remote.discovery == "tcpstore" and remote.embedded:
            raise ConfigError("store.remote.discovery: tcpstore finds external shards; set "
                              "store.remote.embedded: false")
    if cfg.model.kind in ("deepfm",):
        dims = {t.dim for t in cfg.tables}
        if len(dims) > 1:
            raise ConfigError(f"tables[*].dim: model.kind '{cfg.model.kind}' needs one dim, got {dims}")
    if cfg.model.kind == "dlrm":
        for name in ("bottom", "top"):
            if not getattr(cfg.model, name):
                raise ConfigError(f"model.{name}: DLRM needs one or more layer sizes")
        dims = {t.dim for t in cfg.tables}
        if len(dims) > 1 or cfg.model.bottom[-1] != next(iter(dims)):
            raise ConfigError(
                f"model.bottom: DLRM's last bottom layer ({cfg.model.bottom[-1]}) must equal every "
                f"table's dim ({sorted(dims)})"
            )
        if cfg.model.top[-1] != 1:
            raise ConfigError("model.top: DLRM's top MLP must end in 1 logit")
    _validate_sequences(cfg)
    return cfg


_BEHAVIOURS = ("pv", "cart", "fav", "buy")


def _validate_sequences(cfg: Config) -> None:
    """data.events, unpooled tables and model.din."""
    ev = cfg.data.events
    bad = [b for b in ev.positive if b not in _BEHAVIOURS]
    if not ev.positive or bad:
        raise ConfigError(f"data.events.positive: need behaviours among {', '.join(_BEHAVIOURS)}"
                          f" (got {ev.positive})")
    table_of = {f: (i, t) for i, t in enumerate(cfg.tables) for f in t.features}
    m = cfg.model
    if m.kind != "din":
        for i, t in enumerate(cfg.tables):
            if t.pooling == "none":
                raise ConfigError(f"tables[{i}].pooling: 'none' (unpooled sequences) needs a "
                                  f"sequence model (model.kind: din), not '{m.kind}'")
        return
    d = m.din
    if not d.pairs:
        raise ConfigError("model.din.pairs: DIN needs at least one [target, history] pair")
    if not d.attention:
        raise ConfigError("model.din.attention: need one or more positive layer sizes")
    if not d.mlp:
        raise ConfigError("model.din.mlp: need one or more positive layer sizes")
    seen: set[str] = set()
    for j, pair in enumerate(d.pairs):
        key = f"model.din.pairs[{j}]"
        if len(pair) != 2:
            raise ConfigError(f"{key}: expected [target feature, history feature], got {pair}")
        for f in pair:
            if f in seen:
                raise ConfigError(f"{key}: feature '{f}' appears in more than one place")
            seen.add(f)
        if cfg.features.spec:
            continue  # the tables' features come from the spec later
        for f in pair:
            if f not in table_of:
                raise ConfigError(f"{key}: feature '{f}' is not served by any table")
        (_, target), (hi, hist) = table_of[pair[0]], table_of[pair[1]]
        if hist.pooling != "none":
            raise ConfigError(f"tables[{hi}].pooling: history feature '{pair[1]}' must come from "
                              f"an unpooled table (pooling: none), not '{hist.pooling}'")
        if target.dim != hist.dim:
            raise ConfigError(f"{key}: target '{pair[0]}' (dim {target.dim}) and history "
                              f"'{pair[1]}' (dim {hist.dim}) need one dim")


def model_config(cfg: Config, i: int) -> Config:
    """The single-model config of ``cfg.models[i]``: its model, tables and registry consumer,
    the shared data, store, supply and train settings, and its own output paths."""
    e = cfg.models[i]
    tr = cfg.train

    def own(path: str | None) -> str | None:
        if path is None:
            return None
        p = Path(path)
        return str(p.with_name(f"{p.stem}.{e.name}{p.suffix}") if p.suffix else p / e.name)

    train = dataclasses.replace(
        tr, metrics_json=own(tr.metrics_json), tensorboard_dir=own(tr.tensorboard_dir),
        checkpoint=dataclasses.replace(tr.checkpoint, dir=own(tr.checkpoint.dir)))
    return dataclasses.replace(
        cfg, model=copy.deepcopy(e.model), tables=copy.deepcopy(e.tables), models=[],
        features=dataclasses.replace(cfg.features, consumer=e.name), train=train)


def _validate_models(cfg: Config) -> Config:
    """A multi-model run: shared data and features, one validated config per model."""
    if cfg.tables:
        raise ConfigError("tables: a multi-model run declares its tables per model "
                          "(models[i].tables)")
    if not cfg.features.spec:
        raise ConfigError("features.spec: a multi-model run needs the feature registry its "
                          "models consume from")
    if cfg.features.consumer is not None:
        raise ConfigError("features.consumer: a multi-model run names each consumer in "
                          "models[i].name")
    if cfg.supply.path == "collaborative":
        raise ConfigError("supply.path: 'collaborative' is not supported with several models "
                          "yet (use resident tiers or ps-direct)")
    seen: set[str] = set()
    for i, e in enumerate(cfg.models):
        if not e.name:
            raise ConfigError(f"models[{i}].name: every model needs the name of its registry "
                              "consumer")
        if e.name in seen:
            raise ConfigError(f"models[{i}].name: model '{e.name}' is declared twice")
        seen.add(e.name)
        try:
            validate(model_config(cfg, i))
        except ConfigError as err:
            text = str(err)
            if text.startswith(("tables", "model")):
                text = f"models[{i}].{text}"
            raise ConfigError(text) from None
    return cfg


# A preset sets defaults; every key the config gives overrides it.
PRESETS: dict[str, dict[str, Any]] = {
    "resident": {"supply": {"path": "resident"}},
    # A: rows on the PS, pulled and pushed each step; a write-through device cache when
    # store.device has a capacity; no host tier; double-buffered pulls
    "arch-a": {"supply": {"path": "ps-direct", "lookahead": 1},
               "store": {"device": {"policy": "hotness"}}},
    # B: device, host and PS tiers by hotness; workers deliver the cold rows; lookahead 4
    "arch-b": {"supply": {"path": "collaborative", "lookahead": 4, "fallback": "ps-direct"},
               "store": {"device": {"policy": "hotness"},
                         "host": {"policy": "lfu", "spill": True, "spill_to": "remote"}}},
}


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def apply_preset(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` (a config mapping) over the defaults of its ``preset``. A switch that leaves
    the preset's architecture drops the preset settings it would contradict (ps-direct has
    no host tier; a run without a PS has no collaborative fallback)."""
    name = raw.get("preset")
    if name is None:
        return raw
    if not isinstance(name, str) or name not in PRESETS:
        raise ConfigError(f"preset: {name!r} is not one of {', '.join(map(repr, PRESETS))}")
    preset = copy.deepcopy(PRESETS[name])
    for section in ("supply", "store"):
        if not isinstance(raw.get(section) or {}, dict):
            raise ConfigError(f"{section}: expected a mapping, got {type(raw[section]).__name__}")
    path = (raw.get("supply") or {}).get("path", preset.get("supply", {}).get("path"))
    if path == "ps-direct":
        preset.get("store", {}).pop("host", None)
    if path != "collaborative":
        preset.get("supply", {}).pop("fallback", None)
    return _merge(preset, raw)


def set_dotted(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Set dotted keys (``train.steps``) in a config mapping, in place; returns it."""
    for dotted, value in overrides.items():
        node = raw
        parts = dotted.split(".")
        for i, part in enumerate(parts[:-1]):
            if node.get(part) is None:  # absent, or an empty YAML section
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                raise ConfigError(f"{'.'.join(parts[: i + 1])}: expected a mapping, got "
                                  f"{type(node).__name__} (setting {dotted})")
        node[parts[-1]] = value
    return raw


def config_from_mapping(raw: dict[str, Any]) -> Config:
    """A validated Config from a mapping (its preset applied)."""
    return validate(from_dict(Config, apply_preset(raw)))


def read_config_mapping(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        raw = yaml.safe_load(p.read_bytes()) or {}
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(p)
        raise ConfigError(f"{where}: not valid YAML: {e.problem or e.context}") from None
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: expected a mapping at the top level")
    return raw


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> Config:
    """Read a YAML config; ``overrides`` maps dotted keys (``train.steps``) to values."""
    return config_from_mapping(set_dotted(read_config_mapping(path), overrides or {}))


def config_to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
