"""Several models trained in one run from one feature extraction.

Every model of ``models:`` is a consumer of the feature registry with its own tables, dense
model and optimizers (a whole ``Trainer`` each, on its own thread). One shared data stream
extracts the union of their features, each feature once per batch, in the data workers, and the
fan-out hands every model its view of each batch, in order. Each model trains exactly as it
would alone on the same features; ``features.computed`` and ``features.served`` prove the
extraction ran once. Each model's PS tables live in its own namespace (its name). Under
architecture B (``supply.path: collaborative``) the data workers then do each model's own part
of the batch after the one extraction: its dedup, its resident filter, its cold-row pulls
(``cosparse.supply.models_codec``); a model whose workers' rows fail falls back alone. With
``train.isolate_models`` a model that fails leaves the shared stream and the others train on.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from tqdm import tqdm

from cosparse.config import Config, ConfigError, model_config
from cosparse.supply.models_codec import ModelsCodec
from cosparse.train.fanout import ConsumerView, FanOut, FanOutClosed, ViewReader
from cosparse.train.inputs import ModelInputs, consumer_features, featurized_reader, load_registry
from cosparse.train.trainer import Trainer


def _union(lists: list[list[str]]) -> list[str]:
    return list(dict.fromkeys(f for names in lists for f in names))


class MultiTrainer:
    """Trains every model of ``cfg.models`` on one extraction of their features."""

    def __init__(self, cfg: Config, log: Callable[[str], None] | None = None) -> None:
        self.cfg = cfg
        self.log = log or (lambda msg: tqdm.write(msg))
        registry = load_registry(cfg)
        plans = []
        for i, entry in enumerate(cfg.models):
            try:
                plans.append(consumer_features(model_config(cfg, i), registry))
            except ConfigError as e:
                text = str(e)
                prefix = f"models[{i}]." if text.startswith("tables") else ""
                raise ConfigError(f"{prefix}{text} (model '{entry.name}')") from None
        self.views = [ConsumerView(e.name, tuple(sparse), tuple(dense))
                      for e, (_, sparse, dense) in zip(cfg.models, plans, strict=True)]
        self.sparse = _union([list(v.sparse) for v in self.views])
        self.dense = _union([list(v.dense) for v in self.views])
        self.extracted = len(registry.closure(self.sparse + self.dense))  # computed per batch
        union = featurized_reader(cfg, registry, self.sparse, self.dense, "train")
        # a model that falls back plans again from its last trained batch: the fan-out keeps
        # what its prefetch and planning may hold beyond that, to hand it again
        replay = cfg.supply.lookahead + cfg.supply.horizon + 8
        self.fanout = FanOut(union, self.views, cfg.data.workers, cfg.data.queue_depth,
                             codec=self._round_codec, replay=replay)
        self._union = union
        self.trainers: dict[str, Trainer] = {}
        try:
            for i, (view, (mcfg, sparse, dense)) in enumerate(zip(self.views, plans, strict=True)):
                inputs = ModelInputs(mcfg, ViewReader(union, view),
                                     featurized_reader(mcfg, registry, sparse, dense, "eval"))
                trainer = Trainer(mcfg, log=self._model_log(view.name), inputs=inputs,
                                  stream_factory=self._stream_of(view.name))
                trainer.bar_desc, trainer.bar_position = view.name, i
                self.trainers[view.name] = trainer
        except BaseException:
            self.close()
            raise
        self.log(f"features: {self.extracted} features extracted once per "
                 f"batch for {len(self.views)} models ({', '.join(self.trainers)})")

    def _round_codec(self) -> ModelsCodec | None:
        """The codec of a new round of the shared stream: under architecture B each model
        whose workers' rows are live gets its own part (dedup, filter, cold rows); None when
        no model has one (plain batches)."""
        parts = {v.name: (v.select, self.trainers[v.name].path.codec) for v in self.views
                 if self.trainers[v.name].path.codec is not None}
        if not parts:
            return None
        return ModelsCodec(self._union, parts, plain=len(parts) < len(self.views))

    def _model_log(self, name: str) -> Callable[[str], None]:
        return lambda msg: self.log(f"[{name}] {msg}")

    def _stream_of(self, name: str) -> Callable[[int], Any]:
        return lambda start_batch: self.fanout.stream(name, start_batch)

    def resume(self, path: str) -> None:
        """Resume every model from its checkpoint under ``path`` (``path/<model name>``)."""
        for name, t in self.trainers.items():
            t.resume(os.path.join(path, name))
        steps = {t.state.step for t in self.trainers.values()}
        if len(steps) > 1:
            raise ConfigError(f"--resume: the models' checkpoints are at different steps "
                              f"{sorted(steps)}; a multi-model run resumes them together")

    def run(self) -> dict[str, Any]:
        """Train every model to ``train.steps``; the final metrics of each, the extraction
        counters, and ``failed_models`` (name: error) of the models that failed alone
        (``train.isolate_models``; without it the first failure stops every model and is
        raised)."""
        results: dict[str, dict[str, Any]] = {}
        errors: list[BaseException] = []

        failed: dict[str, str] = {}
        isolate = self.cfg.train.isolate_models

        def train(name: str, t: Trainer) -> None:
            try:
                results[name] = t.run()
            except Exception as e:  # noqa: BLE001 - re-raised on the caller's thread
                if isolate and not isinstance(e, FanOutClosed):  # it stops alone
                    failed[name] = f"{type(e).__name__}: {e}"
                    self.log(f"[{name}] failed, the other models train on "
                             f"(train.isolate_models): {failed[name]}")
                    self.fanout.drop(name)
                    return
                errors.append(e)
                self.fanout.close()  # the others stop too
            except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
                errors.append(e)
                self.fanout.close()

        self._threads = [threading.Thread(target=train, args=(n, t), name=f"cosparse-model-{n}",
                                          daemon=True) for n, t in self.trainers.items()]
        for th in self._threads:
            th.start()
        try:
            for th in self._threads:
                while th.is_alive():  # a timed join lets Ctrl-C reach this thread
                    th.join(timeout=0.5)
        except BaseException:
            self._stop_models()
            raise
        if errors:
            first = next((e for e in errors if not isinstance(e, FanOutClosed)), errors[0])
            raise first
        if failed and not results:
            raise RuntimeError(f"every model failed (train.isolate_models): {failed}")
        f = self.fanout
        served_per_batch = sum(v.num_features for v in self.views)
        return {"models": results,
                "features": {"computed": f.computed, "served": f.served, "batches": f.batches,
                             "extracted": self.extracted,
                             "served_per_batch": served_per_batch},
                "bytes.worker_trainer": f.wire_bytes,
                "failed_models": failed}

    def _stop_models(self) -> None:
        """Stop the shared stream, so every model still training stops with FanOutClosed, and
        wait for the model threads."""
        if hasattr(self, "fanout"):
            self.fanout.close()
        for th in getattr(self, "_threads", []):
            th.join(timeout=60)

    def close(self) -> None:
        """Stop the shared stream and the models, then close every model's trainer (its PS
        shards and files); safe to call twice."""
        self._stop_models()
        for t in getattr(self, "trainers", {}).values():
            t.close()
