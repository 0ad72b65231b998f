"""bench_inmemory's worker side: the workload config every contender rebuilds, the contender
interface and the command loop a contender's process answers (the TorchRec peer's too, in its
own venv: so this module imports nothing of cosparse)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from benchmarks import common


# ------------------------------------------------------------------------------------- config
@dataclasses.dataclass
class BenchConfig(common.Workload):
    """Everything a worker needs to rebuild the workload and its model."""

    warmup: int = 3
    steps: int = 15
    rounds: int = 7
    emb_steps: int = 8
    breakdown_steps: int = 5
    threads: int = 0  # 0: torch default
    device: str = "cpu"  # the cosparse contenders' and the dense bound's (torch's stays on the CPU)

    @property
    def num_batches(self) -> int:
        return self.warmup + self.rounds * (self.steps + self.emb_steps) + self.breakdown_steps

    def full_start(self, r: int) -> int:
        return self.warmup + r * self.steps

    def emb_start(self, r: int) -> int:
        return self.warmup + self.rounds * self.steps + r * self.emb_steps

    @property
    def breakdown_start(self) -> int:
        return self.warmup + self.rounds * (self.steps + self.emb_steps)


# -------------------------------------------------------------------------------- contenders
class Contender:
    """One training setup. ``full`` times whole train steps, ``emb`` the embedding-only work."""

    name = "?"

    def full(self, start: int, n: int) -> list[float]:
        raise NotImplementedError

    def emb(self, start: int, n: int) -> tuple[list[float], dict[str, float]]:
        raise NotImplementedError

    def breakdown(self, start: int, n: int) -> dict[str, float]:
        return {}

    def info(self) -> dict[str, Any]:
        return {}

    last_loss = float("nan")


# ------------------------------------------------------------------------------------ worker
def _emb(c: Contender, cmd: dict[str, Any]) -> dict[str, Any]:
    times, stages = c.emb(cmd["start"], cmd["n"])
    return {"step_s": times, "stages_ms": stages}


COMMANDS: dict[str, Callable[[Contender, dict[str, Any]], dict[str, Any]]] = {
    "full": lambda c, cmd: {"step_s": c.full(cmd["start"], cmd["n"]), "loss": c.last_loss,
                            "run_s": getattr(c, "last_run_s", None)},
    "emb": _emb,
    "breakdown": lambda c, cmd: {"breakdown_ms": c.breakdown(cmd["start"], cmd["n"])},
    "stats": lambda c, cmd: common.process_stats(c.info()),
}


def serve_contender(build: Callable[[BenchConfig, list[common.Batch]], Contender], cfg: BenchConfig) -> None:
    """Worker: generate the batches, build the contender, answer COMMANDS (also run by the peer)."""

    def setup() -> tuple[Contender, dict[str, Any]]:
        common.set_threads(cfg.threads)
        t0 = time.perf_counter()
        raw = common.make_batches(cfg, cfg.num_batches)
        datagen_s = time.perf_counter() - t0
        ready = {"checksum": common.data_checksum(raw), "datagen_s": round(datagen_s, 2),
                 "ids_per_batch": round(common.ids_per_batch(raw)),
                 "rss_after_data_mb": round(common.rss_mb())}
        t0 = time.perf_counter()
        c = build(cfg, raw)
        del raw
        return c, {**ready, "setup_s": round(time.perf_counter() - t0, 2)}

    common.serve(setup, COMMANDS)
