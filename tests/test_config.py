"""Config loading: unknown keys, bad values and inconsistent settings fail at start-up, naming the key."""

import pytest
import yaml

from cosparse.config import ConfigError, load_config, parse_bytes

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
    import copy

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


def test_parse_bytes():
    assert parse_bytes("2GiB", "k") == 2 * 2**30
    assert parse_bytes("512MB", "k") == 512 * 10**6
    with pytest.raises(ConfigError, match="k:"):
        parse_bytes("lots", "k")


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
