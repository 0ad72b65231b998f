"""``bench_inmemory``'s trainer contenders: the same DLRM workload trained by the engine's trainer,
through the built-in ``model.kind: dlrm`` and through the public API (issue 34: "no per-step cost
from the API, within noise, paired in one run").

  builtin  the internal trainer (``cosparse.train.trainer.Trainer``) over a config with
           ``model.kind: dlrm``: what ``cosparse train`` runs for a built-in model.
  api      ``cosparse.Trainer(model, config)`` with ``model`` built by
           ``cosparse.models.dlrm:build`` (the factory, after ``torch.manual_seed(train.seed)``,
           as ``model.factory`` builds it): DLRM written on the public API.

Both read the bench's pre-generated batches (``BatchesReader``: no data generation while timed) in
the same order, with the same tables, the same dense Adagrad and the same seed, so they train the
same numbers: the parent compares their losses round by round (``paired_api``). A round is one
``run`` of the trainer to ``steps`` further (no evaluation); its steps' times are the trainer's own
(``step_ms`` of its step records: from the end of the step before, the wait for the batch
included), and ``run_s`` is the whole call, the run's start and end included.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from benchmarks import common

TRAINERS = ("builtin", "api")
DLRM_FACTORY = "cosparse.models.dlrm:build"


class BatchesReader:
    """A ``cosparse.data.reader.Reader`` over SparseBatches already built (task ``i``: batch ``i``)."""

    def __init__(self, keys: list[str], num_dense: int, batches: list[Any]) -> None:
        self.keys, self.num_dense, self.batches = list(keys), num_dense, batches

    @property
    def num_batches(self) -> int:
        return len(self.batches)

    def tasks(self, start_batch: int = 0) -> Iterator[int]:
        return iter(range(start_batch, len(self.batches)))

    def build(self, task: int) -> Any:
        return self.batches[task]


def trainer_config(cfg: Any, api: bool) -> dict[str, Any]:
    """The run's config: the bench's tables (all resident), its DLRM sizes and optimizers, no
    evaluation, checkpoint, metrics file or progress bar."""
    shape = {"bottom": [*common.BOTTOM, cfg.dim], "top": list(common.TOP)}
    model: dict[str, Any] = ({"factory": DLRM_FACTORY, "args": shape} if api
                             else {"kind": "dlrm", **shape})
    return {
        "data": {"reader": "synthetic", "batch_size": cfg.batch, "workers": 0},
        "model": {**model, "dense_optimizer": {"kind": "adagrad", "lr": cfg.lr}},
        "tables": [{"name": t.name, "dim": t.dim, "features": list(t.features), "pooling": "sum",
                    "num_embeddings": t.num_embeddings,
                    "optimizer": {"kind": "rowwise_adagrad", "lr": cfg.lr, "eps": cfg.eps}}
                   for t in common.table_configs(cfg)],
        "supply": {"lookahead": 1},
        "train": {"seed": cfg.seed, "device": cfg.device, "progress": False,
                  "log_every": 1_000_000, "timing_warmup_steps": 0,
                  **({"threads": cfg.threads} if cfg.threads else {})},
    }


class TrainerContender:
    """The engine's trainer over the bench's batches: ``builtin`` or ``api`` (see the module)."""

    def __init__(self, cfg: Any, raw: list[common.Batch], api: bool) -> None:
        import torch

        from cosparse.config import config_from_mapping
        from cosparse.train.inputs import ModelInputs

        self.name = "api" if api else "builtin"
        self.last_loss, self.last_run_s = float("nan"), float("nan")
        config = config_from_mapping(trainer_config(cfg, api))
        n_train = cfg.warmup + cfg.rounds * cfg.steps  # the full steps' batches, in their order
        train = BatchesReader(cfg.features, common.NUM_DENSE,
                              common.sparse_batches(cfg, raw[:n_train]))
        inputs = ModelInputs(config, train, BatchesReader(cfg.features, common.NUM_DENSE, []))
        if api:
            import cosparse
            from cosparse.api.factory import build_factory_model

            model = build_factory_model(config, common.NUM_DENSE)
            self.trainer: Any = cosparse.Trainer(model, config, inputs=inputs, log=_quiet)
            self.engine = self.trainer.engine
        else:
            from cosparse.train.trainer import Trainer

            torch.manual_seed(cfg.seed)
            self.trainer = self.engine = Trainer(config, log=_quiet, inputs=inputs)
        self.step_ms: list[float] = []
        self.stages: dict[str, list[float]] = defaultdict(list)  # the timed rounds' steps'
        record = self.engine.recorder.step

        def step(*a: Any, **k: Any) -> dict[str, Any]:  # the trainer's own step times
            rec = record(*a, **k)
            self.step_ms.append(rec["step_ms"])
            if self.engine.state.step > cfg.warmup:
                for stage, ms in rec["stages"].items():
                    self.stages[stage].append(ms)
            return rec

        self.engine.recorder.step = step

    def full(self, start: int, n: int) -> list[float]:
        """Train batches ``start .. start + n - 1`` (the trainer's next ones): one ``run``."""
        if start != self.engine.state.step:
            raise ValueError(f"{self.name}: asked for step {start}, the trainer is at "
                             f"{self.engine.state.step} (its data is read in order)")
        self.step_ms.clear()
        t0 = time.perf_counter()
        self.engine.run(start + n, evaluate=False)
        self.last_run_s = time.perf_counter() - t0
        if len(self.step_ms) != n:
            raise RuntimeError(f"{self.name}: {len(self.step_ms)} steps recorded, {n} asked")
        self.last_loss = float(self.engine.losses[-1])
        return [ms / 1e3 for ms in self.step_ms]

    def emb(self, start: int, n: int) -> tuple[list[float], dict[str, float]]:
        raise ValueError(f"{self.name}: no embedding-only pass (a whole trainer)")

    def breakdown(self, start: int, n: int) -> dict[str, float]:
        return {}

    def info(self) -> dict[str, Any]:
        import torch

        return {"trainer": type(self.trainer).__module__ + "." + type(self.trainer).__name__,
                "model": type(self.engine.model).__name__,
                "torch_threads": torch.get_num_threads(),
                "stages_ms_p50": {k: round(statistics.median(v), 2) for k, v in self.stages.items()}}

    def close(self) -> None:
        self.trainer.close()


def _quiet(line: str) -> None:
    """The trainer's log lines: not printed (the worker's stdout is the protocol's)."""


def paired_api(res: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``api_over_builtin``: per round, api's samples/s over builtin's in the same round; the
    median and its spread. ``api_over_builtin_step_p50``: the median step time of builtin over
    api's. ``api_over_builtin_run``: as ``api_over_builtin``, of whole ``run`` calls (their start
    and end included). Raises when the two did not train the same losses."""
    a, b = res["api"], res["builtin"]
    if a["losses"] != b["losses"]:
        raise RuntimeError(f"api and builtin trained different numbers: round losses "
                           f"{a['losses']} vs {b['losses']}")
    per_round = [x / y for x, y in zip(a["rounds_samples_per_s"], b["rounds_samples_per_s"],
                                       strict=True)]
    per_run = [y / x for x, y in zip(a["run_s"], b["run_s"], strict=True)]
    return {"api_over_builtin": round(statistics.median(per_round), 3),
            "api_over_builtin_spread": _spread(per_round),
            # the trainer's own step times, all rounds': builtin's p50 over api's (> 1: api faster)
            "api_over_builtin_step_p50": round(statistics.median(b["step_s"])
                                               / statistics.median(a["step_s"]), 3),
            "api_over_builtin_run": round(statistics.median(per_run), 3),
            "api_over_builtin_run_spread": _spread(per_run),
            "api_builtin_same_losses": True, "api_builtin_final_loss": a["losses"][-1]}


def _spread(ratios: list[float]) -> dict[str, Any]:
    return {"min": round(min(ratios), 3), "p25": round(common.pct(ratios, 0.25), 3),
            "p75": round(common.pct(ratios, 0.75), 3), "max": round(max(ratios), 3),
            "rounds": [round(x, 3) for x in ratios]}


def stage_differences(api: dict[str, Any], builtin: dict[str, Any]) -> dict[str, float]:
    """Per stage of the trainer's step records, api's median ms minus builtin's (the timed
    rounds' steps): where a per-step cost of the API would show."""
    a, b = api["stages_ms_p50"], builtin["stages_ms_p50"]
    return {k: round(a[k] - b[k], 2) for k in a if k in b}
