"""``cosparse compare``: train two variants of one config (say A and B) on the same data, order
and seed, and measure both the same way.

A variant is ``PRESET[,key=value...]``, applied by ``cosparse.config.switch_preset``: the
preset's switches replace the config's own (the capacities, model, data and seed stay), then the
dotted keys override them, e.g. ``arch-b,supply.path=ps-tiered`` for the migration step with B's
tiers and A's supply. Each run trains ``warmup`` steps first; speed, bytes, hit rates and host
usage are measured over the rest, and the loss curve covers every step.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from cosparse.config import (
    PRESETS,
    Config,
    ConfigError,
    config_from_mapping,
    read_config_mapping,
    set_dotted,
    switch_preset,
)
from cosparse.report.compare_file import COMPARE_FORMAT
from cosparse.report.explain import explain
from cosparse.report.html import write_report
from cosparse.strict_json import dumps_metrics
from cosparse.train.host_usage import HostUsage
from cosparse.train.step_records import steps_path
from cosparse.train.trainer import Trainer

_LINKS = {"worker_ps": "bytes.worker_ps", "trainer_ps.pull": "bytes.trainer_ps.pull",
          "trainer_ps.push": "bytes.trainer_ps.push", "worker_trainer": "bytes.worker_trainer",
          "device_host": "bytes.device_host"}
_TO_DEVICE = ("bytes.host_device", "bytes.delivered_device", "bytes.backing_device")


def parse_variant(spec: str) -> tuple[str, dict[str, Any]]:
    """``arch-b,supply.lookahead=1`` -> ("arch-b", {"supply.lookahead": 1})."""
    name, *sets = [p.strip() for p in spec.split(",") if p.strip()]
    if name not in PRESETS:
        raise ConfigError(f"variant {spec!r}: {name!r} is not a preset "
                          f"({', '.join(PRESETS)})")
    overrides = {}
    for item in sets:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ConfigError(f"variant {spec!r}: {item!r} is not key=value")
        overrides[key] = yaml.safe_load(value)
    return name, overrides


def measuring_trainer(cfg: Config, label: str, log: Callable[[str], None],
                      records: Path | None = None) -> Trainer:
    """A ``Trainer`` set up to be measured (no logging between calls, evaluation, checkpoints
    or warm-up skip of its own); ``records``: where its metrics and step records go."""
    cfg.train.log_every = cfg.train.steps
    cfg.train.progress = False
    cfg.train.eval_every = 0
    cfg.train.metrics_json = str(records) if records is not None else None
    cfg.train.tensorboard_dir = None
    cfg.train.checkpoint.every = 0
    cfg.train.timing_warmup_steps = 0  # (warm-up steps are a call of their own)
    return Trainer(cfg, log=lambda m: log(f"[{label}] {m}"))


def measure_call(t: Trainer, label: str, steps: int | None = None, evaluate: bool = True
                 ) -> dict[str, Any]:
    """Train ``steps`` more steps (None: up to ``train.steps``) and return their figures as one
    ``compare.json`` run; the loss curve covers every step the trainer has trained."""
    step0 = t.state.step
    # the embedded PS shards are the run's own processes, not the host's other load
    usage = HostUsage(exclude=set(getattr(t.path, "shard_pids", ()))).start()
    final = t.run(steps=None if steps is None else step0 + steps, evaluate=evaluate)
    host = usage.stop()
    measured = max(1, t.state.step - step0)

    def per_step(key: str) -> float | None:
        return final[key] / measured if key in final else None

    run: dict[str, Any] = {
        "label": label, "losses": list(t.losses), "auc": final.get("auc"),
        "logloss": final.get("logloss"), "samples_per_s": final.get("samples_per_s"),
        "step_ms_p50": final.get("step_ms_p50"), "step_ms_p99": final.get("step_ms_p99"),
        "stage_ms": {k.split(".", 1)[1]: v for k, v in final.items() if k.startswith("stage_ms.")},
        "bytes_per_step": {name: per_step(key) for name, key in _LINKS.items()},
        "wasted_bytes_per_step.worker_ps": per_step("wasted_bytes.worker_ps"),
        "stale_drops": final.get("stale_drops", 0), "fallbacks": final.get("fallbacks", 0),
        "hit_rate": {"device": final.get("hit_rate.device"), "host": final.get("hit_rate.host")},
        "miss_sources": {k.split(".", 1)[1]: v for k, v in final.items()
                         if k.startswith("miss_share.")},
        "hbm_share": final.get("hbm_share"), "host": host, "measured_steps": measured,
        "sync": final.get("sync"),  # the blocking hand-offs per step, by site
    }
    to_device = [final[k] for k in _TO_DEVICE if k in final]
    run["bytes_per_step"]["host_device"] = sum(to_device) / measured if to_device else None
    return run


def measure(cfg: Config, warmup: int, label: str, log: Callable[[str], None],
            records: Path | None = None) -> dict[str, Any]:
    """Train ``cfg`` and return its figures as one ``compare.json`` run; ``records``: where
    its metrics and step records go, whose slow steps the run's ``slow_steps`` explains."""
    t = measuring_trainer(cfg, label, log, records)
    try:
        if warmup:
            t.run(steps=warmup, evaluate=False)
        run = measure_call(t, label)
    finally:
        t.close()
    if records is not None:  # (the step records are complete once the trainer is closed)
        run["slow_steps"] = explain(steps_path(str(records)), top=5).to_json()
    return run


def compare(config: str | Path, a: str, b: str, steps: int, out_dir: str | Path,
            warmup: int | None = None, link_mbps: float | None = None,
            link_latency_ms: float = 0.0, data: str | None = None,
            log: Callable[[str], None] = print,
            config_b: str | Path | None = None) -> dict[str, Any]:
    """Run both variants and write ``compare.json`` and ``report.html`` into ``out_dir``.
    ``config_b``: variant b's config file, when it differs from ``config`` in more than
    switches (say, features from the feature platform instead of the reader's own)."""
    if steps < 2:
        raise ConfigError("--steps: need at least 2")
    warmup = min(steps // 5, 50) if warmup is None else warmup
    if not 0 <= warmup < steps:
        raise ConfigError("--warmup: must be in [0, steps)")
    raws = {"a": read_config_mapping(config), "b": read_config_mapping(config_b or config)}
    for raw in raws.values():
        set_dotted(raw, {"train.steps": steps, "network.link_mbps": link_mbps,
                         "network.link_latency_ms": link_latency_ms})
        if data:
            set_dotted(raw, {"data.path": data})
    variants = {key: parse_variant(spec) for key, spec in (("a", a), ("b", b))}
    cfgs = {key: config_from_mapping(switch_preset(raws[key], *v))
            for key, v in variants.items()}
    runs = {}
    for key, cfg in cfgs.items():
        spec = a if key == "a" else b
        log(f"compare: running {key} = {spec} for {steps} steps ({warmup} warm-up)")
        records = Path(out_dir) / f"{key}.metrics.jsonl"
        records.unlink(missing_ok=True)
        runs[key] = {**measure(cfg, warmup, spec, log, records), "preset": variants[key][0],
                     "overrides": variants[key][1]}
    la, lb = runs["a"]["losses"], runs["b"]["losses"]
    diff = max((abs(x - y) for x, y in zip(la, lb, strict=False)), default=0.0)
    result = {
        "format": COMPARE_FORMAT, "config": str(config), "config_b": str(config_b or config), "steps": steps,
        "warmup": warmup, "link_mbps": link_mbps, "link_latency_ms": link_latency_ms,
        "created": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "loss_identical": la == lb, "loss_max_abs_diff": diff if len(la) == len(lb) else None,
        "runs": runs,
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(dumps_metrics(result, indent=1, sort_keys=True))
    write_report(result, out / "report.html")
    log(f"compare: wrote {out / 'compare.json'} and {out / 'report.html'}")
    return result
