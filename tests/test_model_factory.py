"""Models by name (issue 34, item 3): ``model.factory`` in YAML builds a user's model from a
module outside the package (found through ``--model-path``), ``cosparse train`` trains it with
the same losses as the same model given to ``cosparse.Trainer`` in Python, a bad factory is a
config error naming ``model.factory``, and ``--resume`` rebuilds the model through the factory
(refusing a checkpoint another factory wrote)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import cosparse
from cosparse.api.factory import MODEL_PATH_ENV, add_model_paths, make_trainer, resolve_factory
from cosparse.autotune import trial_run
from cosparse.cli import main
from cosparse.config import ConfigError

STEPS = 6
MODULE = "factory_user_model"
SOURCE = '''
import torch
from torch import nn

import cosparse


class Model(nn.Module):
    def __init__(self, tables, num_dense, hidden):
        super().__init__()
        self.lookup = cosparse.EmbeddingBagCollection(tables)
        width = sum(t.dim * len(t.features) for t in tables) + num_dense
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, batch):
        pooled = self.lookup(batch)
        return self.mlp(torch.cat([*pooled.values(), batch.dense], dim=1)).squeeze(1)


def build(tables, num_dense, hidden=8):
    return Model(tables, num_dense, hidden)


NOT_CALLABLE = 3
'''


def config(tmp_path: Path, **model: object) -> dict:
    """A small synthetic run of the factory's model (3 dense inputs, one pooled table)."""
    return {
        "data": {"reader": "synthetic", "batch_size": 64, "workers": 0,
                 "synthetic": {"num_features": 3, "num_dense": 3, "vocab_size": 2000,
                               "alpha": 1.05, "seed": 7, "num_batches": STEPS + 2,
                               "eval_batches": 1}},
        "model": {"factory": f"{MODULE}:build", "args": {"hidden": 6},
                  "dense_optimizer": {"kind": "adam", "lr": 0.01}, **model},
        "tables": [{"name": "items", "dim": 4, "features": ["C1", "C2", "C3"],
                    "optimizer": {"kind": "rowwise_adagrad", "lr": 0.05}}],
        "train": {"steps": STEPS, "log_every": 1, "progress": False, "threads": 1,
                  "checkpoint": {"dir": str(tmp_path / "ckpt"), "every": STEPS // 2}},
        "supply": {"lookahead": 1},
    }


@pytest.fixture
def models_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder holding the factory's module, not on sys.path; what --model-path adds to
    sys.path and the environment is undone after the test."""
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / f"{MODULE}.py").write_text(SOURCE)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv(MODEL_PATH_ENV, raising=False)
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    yield folder
    sys.modules.pop(MODULE, None)


def cli_train(tmp_path: Path, raw: dict, models_dir: Path, name: str, *extra: str) -> list[dict]:
    """``cosparse train`` on ``raw``: the metrics records it wrote."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    metrics = tmp_path / f"{name}.jsonl"
    code = main(["train", "--config", str(path), "--model-path", str(models_dir),
                 "--metrics-json", str(metrics), "--no-progress", *extra])
    assert code == 0
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def losses_of(records: list[dict]) -> list[float]:
    """The loss of every step (log_every: 1), in order."""
    return [r["loss"] for r in records if r["kind"] == "train"]


def test_yaml_factory_trains_as_the_python_model(tmp_path: Path, models_dir: Path) -> None:
    raw = config(tmp_path)
    from_yaml = losses_of(cli_train(tmp_path, raw, models_dir, "yaml"))
    assert os.environ[MODEL_PATH_ENV].split(os.pathsep)[0] == str(models_dir.resolve())
    module = __import__(MODULE)
    del raw["model"]["factory"], raw["model"]["args"]
    raw["train"]["checkpoint"] = {"dir": str(tmp_path / "python-ckpt"), "every": 0}
    cfg = cosparse.load_config(raw)
    torch.manual_seed(cfg.train.seed)  # (what the factory is called after)
    with cosparse.Trainer(module.build(cfg.tables, 3, hidden=6), cfg,
                          log=lambda m: None) as trainer:
        from_python = trainer.fit().losses
    assert len(from_python) == STEPS
    assert from_yaml == from_python


def test_a_tuner_trial_builds_through_the_factory(tmp_path: Path, models_dir: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A trial (its own process under ``cosparse tune``) finds the module through
    ``COSPARSE_MODEL_PATH`` alone, and trains the numbers ``cosparse train`` does."""
    by_train = losses_of(cli_train(tmp_path, config(tmp_path), models_dir, "train"))
    sys.path.remove(str(models_dir.resolve()))  # (what a new process has: the environment)
    sys.modules.pop(MODULE)
    raw = config(tmp_path)
    raw["train"]["checkpoint"] = {"dir": str(tmp_path / "trial-ckpt"), "every": 0}
    path = tmp_path / "trial.json"
    path.write_text(json.dumps(raw))
    capsys.readouterr()
    assert trial_run.main(str(path)) == 0
    done = [json.loads(line) for line in capsys.readouterr().out.splitlines()][-1]
    digest = hashlib.sha256(np.asarray(by_train, dtype=np.float32).tobytes()).hexdigest()
    assert done["done"] and done["loss_digest"] == digest


def test_resume_rebuilds_through_the_factory(tmp_path: Path, models_dir: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    raw = config(tmp_path)
    whole = losses_of(cli_train(tmp_path, raw, models_dir, "whole"))
    middle = tmp_path / "ckpt" / f"step_{STEPS // 2:08d}"
    assert (middle / "meta.json").exists(), sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    saved = json.loads((middle / "meta.json").read_text())["config"]["model"]
    assert (saved["factory"], saved["args"]) == (f"{MODULE}:build", {"hidden": 6})
    raw["train"]["checkpoint"] = {"dir": str(tmp_path / "ckpt2"), "every": 0}
    resumed = losses_of(cli_train(tmp_path, raw, models_dir, "resumed", "--resume", str(middle)))
    assert len(whole) == STEPS and resumed == whole[STEPS // 2:]
    other = config(tmp_path, args={"hidden": 5})
    path = tmp_path / "other.yaml"
    path.write_text(yaml.safe_dump(other))
    code = main(["train", "--config", str(path), "--model-path", str(models_dir),
                 "--resume", str(middle), "--no-progress",
                 "--metrics-json", str(tmp_path / "other.jsonl")])
    assert code != 0
    assert "holds the model of factory 'factory_user_model:build' with args {'hidden': 6}" in (
        capsys.readouterr().err)


@pytest.mark.parametrize("spec, cause", [
    ("no_colon_here", "not of the form"),
    ("no_such_module_x:build", "does not import"),
    (f"{MODULE}:missing", "has no 'missing'"),
    (f"{MODULE}:NOT_CALLABLE", "not callable"),
])
def test_bad_factory_is_a_config_error(spec: str, cause: str, tmp_path: Path,
                                       models_dir: Path) -> None:
    add_model_paths([models_dir])
    with pytest.raises(ConfigError, match=f"model.factory: .*{cause}"):
        resolve_factory(spec)


def test_factory_and_kind_are_exclusive(tmp_path: Path) -> None:
    for load in (cosparse.load_config, lambda raw: cosparse.config.config_from_mapping(raw)):
        with pytest.raises(ConfigError, match="model.factory: .*model.kind 'dlrm'"):
            load(config(tmp_path, kind="dlrm"))
    with pytest.raises(ConfigError, match="model.args: .*model.factory"):
        cosparse.config.config_from_mapping(
            {**config(tmp_path), "model": {"kind": "dlrm", "args": {"hidden": 2},
                                           "bottom": [4], "top": [1]}})
    with pytest.raises(ConfigError, match="model.factory: 'build' is not of the form"):
        cosparse.config.config_from_mapping(config(tmp_path, factory="build"))
    cfg = cosparse.config.config_from_mapping(config(tmp_path))
    assert cfg.model.kind is None and cfg.model.factory == f"{MODULE}:build"


def test_cli_names_the_factory_it_cannot_import(tmp_path: Path, models_dir: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config(tmp_path, factory="nowhere_module_q:build")))
    code = main(["train", "--config", str(path), "--no-progress",
                 "--metrics-json", str(tmp_path / "bad.jsonl")])
    assert code != 0
    assert "model.factory: 'nowhere_module_q:build'" in capsys.readouterr().err


def built_in_and_factory_losses(tmp_path: Path, *raws: dict) -> list[list[float]]:
    """The losses of each config of ``raws``, trained as ``cosparse train`` trains it."""
    losses = []
    for i, one in enumerate(raws):
        one["train"] = {**one["train"], "metrics_json": str(tmp_path / f"m{i}.jsonl")}
        trainer = make_trainer(cosparse.config.config_from_mapping(one), log=lambda m: None)
        try:
            trainer.run(evaluate=False)
            if "store" in one:
                assert trainer.cfg.store.tiered and trainer.sizing is not None
            losses.append(list(trainer.losses))
        finally:
            trainer.close()
    return losses


def din_config(tmp_path: Path) -> dict:
    """A small DIN run over synthetic behaviour sequences (two [target, history] pairs of
    unpooled tables, a pooled user table, a mean-pooled unpooled one; no dense inputs)."""
    rwa = {"kind": "rowwise_adagrad", "lr": 0.1}
    return {
        "data": {"reader": "synthetic_sequences", "batch_size": 64, "workers": 0,
                 "events": {"synthetic": {"seq_len": 6, "vocab_size": 800, "num_cates": 20,
                                          "num_users": 100, "num_batches": STEPS + 2}}},
        "tables": [
            {"name": "item", "dim": 4, "features": ["target_item", "hist_item"],
             "pooling": "none", "optimizer": rwa},
            {"name": "cate", "dim": 4, "features": ["target_cate", "hist_cate"],
             "pooling": "none", "optimizer": rwa},
            {"name": "user", "dim": 4, "features": ["user"], "optimizer": rwa},
            {"name": "btag", "dim": 2, "features": ["hist_btag"], "pooling": "mean",
             "optimizer": rwa}],
        "train": {"steps": STEPS, "log_every": 1, "progress": False, "threads": 1},
        "supply": {"lookahead": 1},
    }


ZOO = {  # model.kind -> (its built-in model section, the factory's args)
    "dlrm": ({"bottom": [8, 4], "top": [8, 1]}, {"bottom": [8, 4], "top": [8, 1]}),
    "dlrm-dropout": ({"bottom": [8, 4], "top": [8, 1], "dropout": 0.3},
                     {"bottom": [8, 4], "top": [8, 1], "dropout": 0.3}),
    "deepfm": ({"deep": [8, 4], "dropout": 0.3}, {"deep": [8, 4], "dropout": 0.3}),
    "dcn": ({"cross_layers": 2, "cross_rank": 3, "deep": [8]},
            {"cross_layers": 2, "cross_rank": 3, "deep": [8]}),
    "din": ({"din": {"pairs": [["target_item", "hist_item"], ["target_cate", "hist_cate"]],
                     "attention": [8, 4], "mlp": [8], "normalize": "softmax"}, "dropout": 0.3},
            {"pairs": [["target_item", "hist_item"], ["target_cate", "hist_cate"]],
             "attention": [8, 4], "mlp": [8], "normalize": "softmax", "dropout": 0.3}),
}


@pytest.mark.parametrize("case", sorted(ZOO))
def test_the_zoo_factories_train_the_built_in_models_bit_for_bit(tmp_path: Path,
                                                                 case: str) -> None:
    """``cosparse.models.<kind>:build`` (on the public API) against ``model.kind: <kind>`` on
    the same config: DLRM, DeepFM and DIN with tower dropout (whose masks the trainer seeds on
    the public path too), DCN-v2 low-rank, DIN over unpooled history tables
    (``cosparse.Jagged`` lookups); the pooled models on the demo's layout shrunk: device tiers
    sized "dense first" from a budget, over a host tier."""
    kind = case.split("-")[0]
    if kind == "din":
        raw = din_config(tmp_path)
    else:
        raw = config(tmp_path)
        raw["data"]["synthetic"]["num_features"] = 4
        raw["tables"][0]["features"] = ["C1", "C2", "C3", "C4"]
        raw["store"] = {"device": {"budget_bytes": "64KiB", "policy": "hotness"},
                        "host": {"policy": "lfu"}}
        raw["train"]["checkpoint"] = {"dir": str(tmp_path / "ckpt"), "every": 0}
    raw["train"]["seed"] = 11  # (the dropout masks' seed: the run's, on both paths)
    section, args = ZOO[case]
    optimizer = {"dense_optimizer": {"kind": "adagrad", "lr": 0.05}}
    built_in = {**raw, "model": {"kind": kind, **section, **optimizer}}
    factory = {**raw, "model": {"factory": f"cosparse.models.{kind}:build", "args": args,
                                **optimizer}}
    losses = built_in_and_factory_losses(tmp_path, built_in, factory)
    assert len(losses[0]) == STEPS and losses[0] == losses[1]


def test_cosparse_check_builds_a_factory_model_for_each_placement(tmp_path: Path,
                                                                   models_dir: Path,
                                                                   capsys) -> None:
    path = tmp_path / "check.yaml"
    path.write_text(yaml.safe_dump(config(tmp_path)))
    code = main(["check", "--config", str(path), "--model-path", str(models_dir),
                 "--steps", "4", "--only", "tiered,resume"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "bit-identical on every placement" in out and "tiered" in out and "resume" in out


@pytest.mark.parametrize("kind", ["dlrm", "deepfm", "dcn", "din"])
def test_model_kind_is_shorthand_for_the_zoo_factory(tmp_path: Path, kind: str) -> None:
    """``model.kind: <kind>`` builds ``cosparse.models.<kind>:build``'s model (the model
    section's keys its args: the test above trains both the same) behind the ``EngineModel`` a
    model of the user's own trains behind: the trainer has one model path."""
    from cosparse.models.builtin import build_model
    from cosparse.nn.engine_model import EngineModel

    raw = din_config(tmp_path) if kind == "din" else config(tmp_path)
    raw["model"] = {"kind": kind, **ZOO[kind][0]}
    cfg = cosparse.config.config_from_mapping(raw)
    model = build_model(cfg, 0 if kind == "din" else 3, torch.device("cpu"))
    assert isinstance(model, EngineModel) and model.ec is not None
    assert type(model.model).__module__ == f"cosparse.models.{kind}"
    assert (model.dropout is not None) == bool(cfg.model.dropout)
