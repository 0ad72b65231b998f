"""Config loading: unknown keys, bad values and inconsistent settings fail at start-up, naming the key."""

import copy

import pytest
import torch
import yaml

from cosparse.config import ConfigError, config_from_mapping, load_config, parse_bytes

BASE = {
    "data": {"reader": "synthetic", "batch_size": 32},
    "model": {"kind": "dlrm", "bottom": [8, 4], "top": [8, 1]},
    "tables": [{"name": "t", "dim": 4, "features": ["C1", "C2"]}],
    "train": {"steps": 2},
}


def _write(tmp_path, cfg):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def _mutate(path_keys, value):
    cfg = copy.deepcopy(BASE)
    node = cfg
    for k in path_keys[:-1]:
        node = node[k]
    node[path_keys[-1]] = value
    return cfg


def test_valid_config_loads(tmp_path):
    cfg = load_config(_write(tmp_path, BASE), {"train.steps": 7})
    assert cfg.train.steps == 7 and cfg.tables[0].features == ["C1", "C2"]


@pytest.mark.parametrize(
    "keys,value,message",
    [
        (["data", "batchsize"], 3, "data.batchsize"),
        (["model", "kind"], "wide", "model.kind"),
        (["tables", 0, "optimizr"], {}, "tables[0].optimizr"),
        (["tables", 0, "optimizer"], {"kind": "lamb"}, "tables[0].optimizer.kind"),
        (["tables", 0, "dim"], "big", "tables[0].dim"),
        (["tables", 0, "features"], [], "tables[0].features"),
        (["train", "steps"], 0, "train.steps"),
        (["data", "reader"], "criteo_tsv", "data.path"),
        (["model", "bottom"], [8, 5], "model.bottom"),
    ],
)
def test_bad_config_names_the_key(tmp_path, keys, value, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config(_write(tmp_path, _mutate(keys, value)))


def test_feature_in_two_tables_is_rejected(tmp_path):
    cfg = _mutate(["tables"], [{"name": "a", "dim": 4, "features": ["C1"]},
                               {"name": "b", "dim": 4, "features": ["C1"]}])
    with pytest.raises(ConfigError, match=r"tables\[1\].features"):
        load_config(_write(tmp_path, cfg))


def test_budget_that_cannot_hold_the_declared_tables_fails_at_startup(tmp_path):
    from cosparse.nn.embedding import EmbeddingCollection

    cfg = load_config(_write(tmp_path, _mutate(["tables", 0, "num_embeddings"], 1_000_000)))
    with pytest.raises(ConfigError, match="store.device.budget_bytes"):
        EmbeddingCollection(cfg.tables, "cpu", budget_bytes=2**20)


def test_device_budget_below_the_dense_model_fails_at_startup(tmp_path):
    from cosparse.train.trainer import Trainer

    cfg = _mutate(["model", "bottom"], [256, 4])
    cfg["store"] = {"device": {"budget_bytes": "64KiB"}}
    with pytest.raises(ConfigError, match="cannot hold the dense model"):
        Trainer(load_config(_write(tmp_path, cfg)))


def test_device_tier_below_one_batch_fails_at_startup(tmp_path):
    from cosparse.train.trainer import Trainer

    cfg = _mutate(["store"], {"device": {"rows": 3}})
    with pytest.raises(ConfigError, match="store.device: table 't' gets 3 device rows"):
        Trainer(load_config(_write(tmp_path, cfg)))


def test_host_tier_without_device_tier_is_rejected(tmp_path):
    with pytest.raises(ConfigError, match="store.host"):
        load_config(_write(tmp_path, _mutate(["store"], {"host": {"rows": 10}})))


def test_feature_without_data_column_fails_at_startup(tmp_path):
    from cosparse.train.trainer import Trainer

    cfg = _mutate(["tables", 0, "features"], ["C1", "C99"])
    with pytest.raises(ConfigError, match=r"tables\[0\].features: feature 'C99'"):
        Trainer(load_config(_write(tmp_path, cfg)))


def test_regularisation_keys_load_and_default_to_off(tmp_path):
    raw = copy.deepcopy(BASE)
    raw["model"].update(dropout=0.25, dense_optimizer={"kind": "adam", "weight_decay": 0.01})
    raw["tables"][0]["optimizer"] = {"kind": "sgd", "lr": 0.1, "l2": 1e-4}
    cfg = load_config(_write(tmp_path, raw))
    assert cfg.model.dropout == 0.25 and cfg.model.dense_optimizer.weight_decay == 0.01
    assert cfg.tables[0].optimizer.l2 == 1e-4
    plain = load_config(_write(tmp_path, BASE))  # a config from before these keys: all off
    assert plain.model.dropout == 0.0 and plain.model.dense_optimizer.weight_decay == 0.0
    assert plain.tables[0].optimizer.l2 == 0.0


def test_parse_bytes():
    assert parse_bytes("2GiB", "k") == 2 * 2**30
    assert parse_bytes("512MB", "k") == 512 * 10**6
    with pytest.raises(ConfigError, match="k:"):
        parse_bytes("lots", "k")


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


# --- every numeric value in its range (issue 11, defect 9) ------------------------------------
# Each of these was accepted silently (NaN lr, epochs -1, init low > high) or crashed with a raw
# traceback at start-up (negative widths and lr, log_every 0, threads -1).
@pytest.mark.parametrize(
    "keys,value,message",
    [
        (["tables", 0, "optimizer"], {"lr": float("nan")}, "tables[0].optimizer.lr:"),
        (["tables", 0, "optimizer"], {"lr": float("inf")}, "tables[0].optimizer.lr:"),
        (["train", "epochs"], -1, "train.epochs:"),
        (["tables", 0, "init"], {"low": 0.1, "high": -0.1}, "tables[0].init.low:"),
        (["model", "bottom"], [-8, 4], "model.bottom[0]:"),
        (["model", "dense_optimizer"], {"lr": -0.01}, "model.dense_optimizer.lr:"),
        # regularisation (issue 15)
        (["tables", 0, "optimizer"], {"l2": -0.1}, "tables[0].optimizer.l2:"),
        (["model", "dense_optimizer"], {"weight_decay": -1e-4},
         "model.dense_optimizer.weight_decay:"),
        (["model", "dropout"], 1.0, "model.dropout:"),
        (["model", "dropout"], -0.1, "model.dropout:"),
        (["train", "log_every"], 0, "train.log_every:"),
        (["train", "threads"], -1, "train.threads:"),
        (["train", "seed"], 2**64, "train.seed:"),
        (["model", "top"], [], "model.top:"),
        (["store"], {"device": {"budget_bytes": "1.2.3MB"}}, "store.device.budget_bytes:"),
        (["store"], {"device": {"budget_bytes": "99999999999TiB"}}, "store.device.budget_bytes:"),
    ],
)
def test_out_of_range_values_fail_at_startup_naming_the_key(tmp_path, keys, value, message):
    with pytest.raises(ConfigError) as ei:
        load_config(_write(tmp_path, _mutate(keys, value)))
    assert str(ei.value).startswith(message), str(ei.value)


def _populated():
    """A config with every optional numeric field set and every list non-empty."""
    import dataclasses
    import typing

    from cosparse.config import (
        ColumnsConfig,
        EarlyStopConfig,
        ModelEntry,
        NegativesConfig,
        ShuffleConfig,
        SplitConfig,
        StreamConfig,
        TableConfig,
        TraceConfig,
    )
    from cosparse.config.objective import ObjectiveConfig, TaskConfig

    def fill(obj):
        hints = typing.get_type_hints(type(obj))
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            args = typing.get_args(hints[f.name])
            if v is None and (int in args or float in args):
                setattr(obj, f.name, 1)
            elif v is None and list[int] in args:  # an optional list of numbers
                setattr(obj, f.name, [1])
            elif dataclasses.is_dataclass(v):
                fill(v)
            elif isinstance(v, list):
                for x in v:
                    if dataclasses.is_dataclass(x):
                        fill(x)

    cfg = config_from_mapping(BASE)
    cfg.models = [ModelEntry(name="m", model=cfg.model, tables=[TableConfig(name="x")])]
    cfg.data.columns = ColumnsConfig()  # (optional sections)
    cfg.data.split = SplitConfig()
    cfg.data.shuffle = ShuffleConfig()
    cfg.data.negatives = NegativesConfig()
    cfg.data.stream = StreamConfig()
    cfg.train.early_stop = EarlyStopConfig()
    cfg.train.trace = TraceConfig()
    cfg.objective = ObjectiveConfig({"t": TaskConfig()})
    fill(cfg)
    cfg.model.dropout = 0.1  # (the regularisation keys: numeric, with non-zero values)
    cfg.model.dense_optimizer.weight_decay = 1e-4
    cfg.tables[0].optimizer.l2 = 1e-3
    cfg.train.cpu.threads = 1  # (auto | N)
    assert cfg.store.device.rows == 1 and cfg.train.threads == 1
    return cfg


def test_every_numeric_field_has_a_range():
    """A new numeric field cannot skip validation: it needs its entry in config.bounds.BOUNDS
    (and every entry names a real field)."""
    from cosparse.config.bounds import BOUNDS, numeric_leaves, pattern_of

    patterns = {pattern_of(k) for k, _ in numeric_leaves(_populated())}
    assert patterns - set(BOUNDS) == set(), "numeric config fields without a range in BOUNDS"
    assert set(BOUNDS) - patterns == set(), "BOUNDS entries that name no config field"


def _concrete(pattern):
    """``tables[*].optimizer.lr`` -> the key path in BASE (``tables``, 0, ``optimizer``, ``lr``)."""
    out = []
    for part in pattern.split("."):
        name, star, _ = part.partition("[*]")
        out.append(name)
        if star:
            out.append(0)
    return out


def _set(raw, path, value):
    node = raw
    for k, nxt in zip(path[:-1], path[1:], strict=False):
        if isinstance(node, list):
            node = node[k]
            continue
        if k not in node or node[k] is None:
            node[k] = [4] if isinstance(nxt, int) else {}
        node = node[k]
    node[path[-1]] = value


def _outside(bound):
    """Values just outside ``bound``, and NaN."""
    vals = [float("nan"), float("inf")]
    if bound.lo is not None:
        vals.append(int(bound.lo) if bound.lo_open else int(bound.lo) - 1)
    if bound.hi is not None:
        vals.append(bound.hi if bound.hi_open else bound.hi + 1)
    return vals


def test_every_range_is_enforced_naming_the_key(tmp_path):
    from cosparse.config.bounds import BOUNDS

    checked = 0
    for pattern, bound in BOUNDS.items():
        path = _concrete(pattern)
        key = pattern.replace("[*]", "[0]")
        for value in _outside(bound):
            raw = copy.deepcopy(BASE)
            _set(raw, path, value)
            with pytest.raises(ConfigError) as ei:
                load_config(_write(tmp_path, raw))
            assert str(ei.value).startswith(f"{key}:"), (pattern, value, str(ei.value))
            checked += 1
    assert checked > 3 * len(BOUNDS)


def test_yaml_syntax_error_names_file_line_and_column(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("data:\n  reader: synthetic\n  batch_size: [1, 2\ntrain: {}\n")
    with pytest.raises(ConfigError, match=rf"{p}:\d+:\d+: not valid YAML"):
        load_config(p)
    p.write_bytes(b"data: \xff\xfe\x00bad\n")
    with pytest.raises(ConfigError, match=f"{p}"):
        load_config(p)


def test_overrides_into_a_non_mapping_section_name_the_key(tmp_path):
    cfg = dict(BASE, train=5)
    with pytest.raises(ConfigError, match="train: expected a mapping"):
        load_config(_write(tmp_path, cfg), {"train.steps": 3})
    ok = load_config(_write(tmp_path, dict(BASE, train=None)), {"train.steps": 3})
    assert ok.train.steps == 3


# --- settings a placement would ignore fail at start-up, naming the key (issue 12) -------------
TIERS = {"device": {"rows": 64}, "host": {"rows": 128}}


def _loads(raw):
    return config_from_mapping(copy.deepcopy(raw))


def _refused(raw, *keys):
    with pytest.raises(ConfigError) as ei:
        _loads(raw)
    text = str(ei.value)
    assert text.startswith(f"{keys[0]}:") and all(k in text for k in keys), text
    return text


def test_horizon_needs_tiered_tables():
    _refused(dict(BASE, supply={"horizon": 8}), "supply.horizon", "all-resident tables")
    _refused(dict(BASE, store={"device": {"rows": 64}}, supply={"path": "ps-direct", "horizon": 8}),
             "supply.horizon", "supply.path 'ps-direct'")
    cfg = _loads(dict(BASE, store=TIERS, supply={"horizon": 8}))
    assert cfg.supply.horizon == 8


def test_resident_path_never_spills_to_the_ps():
    """``supply.path: resident`` with the PS under the host tier used to start PS shards quietly;
    ``ps-tiered`` says so."""
    remote = {**TIERS, "host": {"rows": 128, "spill": True, "spill_to": "remote"}}
    _refused(dict(BASE, store=remote), "store.host.spill_to", "supply.path 'resident'",
             "supply.path: ps-tiered")
    _refused(dict(BASE, store={**TIERS, "host": {"spill_to": "remote"}}), "store.host.spill_to")
    # a preset's PS under the host does not survive a switch to resident either
    _refused(dict(BASE, preset="arch-b", store=TIERS, supply={"path": "resident"}),
             "store.host.spill_to")
    cfg = _loads(dict(BASE, store=remote, supply={"path": "ps-tiered"}))
    assert cfg.supply.path == "ps-tiered" and cfg.store.host.spill_to == "remote"
    _refused(dict(BASE, store=TIERS, supply={"path": "ps-tiered"}), "store.host.spill/spill_to",
             "supply.path 'ps-tiered'")
    _refused(dict(BASE, supply={"path": "ps-tiered"}), "store.device", "supply.path 'ps-tiered'")


def test_declared_table_sizes_only_for_all_resident_tables():
    sized = _mutate(["tables", 0, "num_embeddings"], 1000)
    assert _loads(sized).tables[0].num_embeddings == 1000
    _refused(dict(sized, store={"device": {"budget_bytes": "1MiB"}}),
             "tables[0].num_embeddings", "store.device.budget_bytes")
    _refused(dict(sized, store={"device": {"rows": 64}}),
             "tables[0].num_embeddings", "store.device.rows")
    _refused(dict(sized, supply={"path": "ps-direct"}),
             "tables[0].num_embeddings", "supply.path 'ps-direct'")


def test_unknown_dense_optimizer_is_refused_naming_the_kinds():
    from cosparse.config import Config, ModelConfig
    from cosparse.train.dense import make_dense_optimizer

    _refused(_mutate(["model", "dense_optimizer"], {"kind": "lamb"}),
             "model.dense_optimizer.kind", "'adagrad'")
    cfg = Config(model=ModelConfig())
    cfg.model.dense_optimizer.kind = "lamb"  # type: ignore[assignment]  # past validation
    with pytest.raises(ConfigError, match=r"model.dense_optimizer.kind: 'lamb' is not one of "
                                          r"'adagrad', 'sgd', 'adam'"):
        make_dense_optimizer(cfg, [torch.nn.Parameter(torch.zeros(2))])


def test_explicit_keys_win_over_the_preset():
    cfg = _loads(dict(BASE, preset="arch-a", store={"device": {"rows": 64, "policy": "lru"}},
                      supply={"lookahead": 3}))
    assert (cfg.supply.path, cfg.supply.lookahead, cfg.store.device.policy) == ("ps-direct", 3, "lru")
    cfg = _loads(dict(BASE, preset="arch-b", store=TIERS))
    assert cfg.supply.fallback == "ps-direct" and cfg.store.host.spill_to == "remote"
    cfg = _loads(dict(BASE, preset="arch-b", store=TIERS, supply={"path": "ps-tiered"}))
    assert cfg.supply.fallback is None and cfg.store.host.spill  # B's tiers, A's supply
