"""The ``model`` section: the dense model (DLRM, DeepFM, DCN-v2, DIN, MMoE, PLE, ESMM or a two
tower) and its optimizer, and its rules, which also cover the tables it reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from cosparse.config.errors import ConfigError
from cosparse.config.multitask import MULTITASK_KINDS, MultiTaskConfig, validate_multitask
from cosparse.config.retrieval import RETRIEVAL_KINDS, TwoTowerConfig, validate_retrieval
from cosparse.config.sequence import SASRecConfig

if TYPE_CHECKING:
    from cosparse.config.root import Config


@dataclass
class DenseOptimizerConfig:
    kind: Literal["adagrad", "sgd", "adam"] = "adagrad"
    lr: float = 0.01
    # L2 weight decay of the dense parameters: adagrad and sgd add weight_decay * w to the
    # gradient (torch's weight_decay); adam decays decoupled from the adaptive step (AdamW)
    weight_decay: float = 0.0


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
    # None: the model is the user's own (``cosparse.Trainer(model, config)``; ``cosparse.load_config``
    # leaves it unset when the config names no kind), and no built-in model's rules apply
    kind: Literal["dlrm", "deepfm", "dcn", "din", "mmoe", "ple", "esmm", "two_tower",
                  "sasrec"] | None = "dlrm"
    # "package.module:function": the user's model, built as function(tables, num_dense, **args)
    # (``cosparse.api.factory``); exclusive with ``kind``, which it leaves unset
    factory: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    bottom: list[int] = field(default_factory=lambda: [64, 16])
    top: list[int] = field(default_factory=lambda: [64, 1])
    deep: list[int] = field(default_factory=lambda: [64, 32])  # DeepFM / DCN-v2 deep tower
    cross_layers: int = 2  # DCN-v2
    cross_rank: int | None = None  # DCN-v2 low-rank cross; None = full matrix
    din: DINConfig = field(default_factory=DINConfig)
    multitask: MultiTaskConfig = field(default_factory=MultiTaskConfig)  # mmoe, ple, esmm
    two_tower: TwoTowerConfig = field(default_factory=TwoTowerConfig)
    sasrec: SASRecConfig = field(default_factory=SASRecConfig)
    # dropout after every hidden activation of the dense towers (DLRM bottom and top, the DeepFM
    # and DCN deep towers, DIN's output MLP); masks follow (train.seed, rank, step), off at eval
    dropout: float = 0.0
    dense_optimizer: DenseOptimizerConfig = field(default_factory=DenseOptimizerConfig)


def validate_model(cfg: Config) -> None:
    """The layer widths each model kind needs from the tables, then sequences and DIN."""
    m = cfg.model
    if m.factory is not None:
        _validate_factory(cfg)
    elif m.args:
        raise ConfigError(f"model.args: {sorted(m.args)} are the arguments of model.factory, "
                          "which this config does not name")
    if m.kind is None:  # a model of the user's own reads whatever its tables give
        if m.dropout:
            raise ConfigError(f"model.dropout: {m.dropout} is the built-in models' tower dropout; "
                              "a model of your own (model.kind unset) uses its own dropout layers")
        return
    dims = {t.dim for t in cfg.tables}
    if m.kind == "deepfm" and len(dims) > 1:
        raise ConfigError(f"tables[*].dim: model.kind '{m.kind}' needs one dim, got {dims}")
    if m.kind == "dlrm":
        for name in ("bottom", "top"):
            if not getattr(m, name):
                raise ConfigError(f"model.{name}: DLRM needs one or more layer sizes")
        if len(dims) > 1 or m.bottom[-1] != next(iter(dims)):
            raise ConfigError(
                f"model.bottom: DLRM's last bottom layer ({m.bottom[-1]}) must equal every "
                f"table's dim ({sorted(dims)})"
            )
        if m.top[-1] != 1:
            raise ConfigError("model.top: DLRM's top MLP must end in 1 logit")
    if m.kind == "din":
        _validate_din(cfg)
        return
    if m.kind in MULTITASK_KINDS:
        validate_multitask(cfg)
    if m.kind in RETRIEVAL_KINDS:
        validate_retrieval(cfg)
    if m.kind == "sasrec":  # (its tables are unpooled: unpool_for_sequences)
        return
    for i, t in enumerate(cfg.tables):
        if t.pooling == "none":
            raise ConfigError(f"tables[{i}].pooling: 'none' (unpooled sequences) needs a "
                              f"sequence model (model.kind: din), not '{m.kind}'")


def factory_exclusive_with_kind(raw: dict[str, Any]) -> None:
    """A config mapping whose ``model`` names a ``factory`` leaves ``kind`` unset (its default
    would be DLRM); naming both is refused."""
    model = raw.get("model")
    if not isinstance(model, dict) or model.get("factory") is None:
        return
    if model.get("kind") is not None:
        raise ConfigError(f"model.factory: '{model['factory']}' builds the model, and model.kind "
                          f"'{model['kind']}' names a built-in one; give one of them")
    raw["model"] = {**model, "kind": None}


def _validate_factory(cfg: Config) -> None:
    """``model.factory``'s form, ``package.module:function`` (whether it imports is checked
    where the model is built: ``cosparse.api.factory``)."""
    m = cfg.model
    if m.kind is not None:
        raise ConfigError(f"model.factory: '{m.factory}' builds the model, and model.kind "
                          f"'{m.kind}' names a built-in one; give one of them")
    module, _, name = (m.factory or "").partition(":")
    if not module.strip() or not name.strip():
        raise ConfigError(f"model.factory: '{m.factory}' is not of the form "
                          "'package.module:function'")
    if cfg.models:
        raise ConfigError("model.factory: a multi-model run (models:) trains built-in models; "
                          "train a model of your own alone")


def _validate_din(cfg: Config) -> None:
    """model.din: its layers, and pairs of features that unpooled tables of one dim serve."""
    d = cfg.model.din
    if not d.pairs:
        raise ConfigError("model.din.pairs: DIN needs at least one [target, history] pair")
    if not d.attention:
        raise ConfigError("model.din.attention: need one or more positive layer sizes")
    if not d.mlp:
        raise ConfigError("model.din.mlp: need one or more positive layer sizes")
    table_of = {f: (i, t) for i, t in enumerate(cfg.tables) for f in t.features}
    seen: set[str] = set()
    for j, pair in enumerate(d.pairs):
        key = f"model.din.pairs[{j}]"
        if len(pair) != 2:
            raise ConfigError(f"{key}: expected [target feature, history feature], got {pair}")
        for f in pair:
            if f in seen:
                raise ConfigError(f"{key}: feature '{f}' appears in more than one place")
            seen.add(f)
        if cfg.features.spec or any(t.features == "auto" for t in cfg.tables):
            continue  # the tables' features come from the spec or the data later
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
