"""The placements that train bit-identically to the all-resident engine, as configs: bounded
device tiers, a host tier that spills to the PS, ps-direct (architecture A) and collaborative
(architecture B); and the rows a run touches, which sizes them. Shared by ``cosparse check``
and the exactness tests."""

from __future__ import annotations

import copy

import numpy as np

from cosparse.config import (
    Config,
    HostTierConfig,
    RemoteConfig,
    StoreConfig,
    SupplyConfig,
    TierConfig,
)
from cosparse.data.reader import NOT_YET
from cosparse.store.dedup import Deduper
from cosparse.train.inputs import model_inputs


def trace_stats(cfg: Config, lookahead: int, steps: int) -> dict[str, tuple[int, int]]:
    """Per table: (rows touched in ``steps`` training batches, the most unique rows of
    lookahead+1 consecutive batches), replayed from the reader exactly as training sees it."""
    inputs = model_inputs(cfg)  # (a file's columns or features included)
    reader, tables = inputs.train, inputs.cfg.tables  # (features: auto resolved)
    dedup = Deduper()
    per_batch: dict[str, list[np.ndarray]] = {t.name: [] for t in tables}
    seen = 0
    while seen < steps:
        before = seen
        tasks = reader.tasks()
        try:
            for task in tasks:
                if task is NOT_YET:
                    continue
                b = reader.build(task)
                for t in tables:
                    ids = np.concatenate([b.feature(f)[0].numpy() for f in t.features])
                    per_batch[t.name].append(dedup.unique(ids)[0])
                seen += 1
                if seen == steps:
                    break
        finally:
            if hasattr(tasks, "close"):
                tasks.close()
        if seen == before:  # an epoch without a batch: the data is shorter than the run
            break
    out = {}
    for name, batches in per_batch.items():
        if not batches:
            out[name] = (0, 0)
            continue
        touched = np.unique(np.concatenate(batches)).shape[0]
        window = max(np.unique(np.concatenate(batches[i:i + lookahead + 1])).shape[0]
                     for i in range(len(batches)))
        out[name] = (touched, window)
    return out


def tiered(cfg: Config, device_rows: int, lookahead: int, workers: int, policy: str,
           host_rows: int | None = None, horizon: int = 0, spill_to: str = "memory") -> Config:
    """Bounded device tiers of ``device_rows`` rows per table over the host; with ``host_rows``
    a bounded host tier too, whose victims spill to memory or (``spill_to="remote"``) to two
    embedded PS shard processes."""
    cfg = copy.deepcopy(cfg)
    cfg.store = StoreConfig(
        device=TierConfig(rows=device_rows, policy=policy),  # type: ignore[arg-type]
        host=HostTierConfig(rows=host_rows, spill=host_rows is not None,
                            spill_to=spill_to),  # type: ignore[arg-type]
        remote=RemoteConfig(embedded=True, num_shards=2),
    )
    cfg.supply = SupplyConfig(path="ps-tiered" if spill_to == "remote" else "resident",
                              lookahead=lookahead, horizon=horizon)
    cfg.data.workers = workers
    return cfg


def ps_direct(cfg: Config, num_shards: int, lookahead: int, cache_rows: int | None = None,
              policy: str = "hotness") -> Config:
    """Architecture A: every row on ``num_shards`` embedded PS shard processes, optionally with a
    write-through device cache of ``cache_rows`` rows per table."""
    cfg = copy.deepcopy(cfg)
    cfg.store = StoreConfig(remote=RemoteConfig(embedded=True, num_shards=num_shards),
                            device=TierConfig(rows=cache_rows, policy=policy))  # type: ignore[arg-type]
    cfg.supply = SupplyConfig(path="ps-direct", lookahead=lookahead)
    return cfg


def collaborative(cfg: Config, device_rows: int, host_rows: int, lookahead: int, workers: int,
                  num_shards: int = 2, fallback: str | None = None) -> Config:
    """Architecture B: device and host tiers over ``num_shards`` embedded PS shards, with the data
    workers delivering the rows the resident filter does not hold."""
    cfg = copy.deepcopy(cfg)
    cfg.store = StoreConfig(
        device=TierConfig(rows=device_rows, policy="hotness"),
        host=HostTierConfig(rows=host_rows, spill=True, spill_to="remote"),
        remote=RemoteConfig(embedded=True, num_shards=num_shards),
    )
    cfg.supply = SupplyConfig(path="collaborative", lookahead=lookahead,
                              fallback=fallback)  # type: ignore[arg-type]
    cfg.data.workers = workers
    return cfg


def resident(cfg: Config) -> Config:
    """Every row in one device-resident table: the reference the other placements match."""
    cfg = copy.deepcopy(cfg)
    cfg.store = StoreConfig()
    cfg.supply = SupplyConfig(path="resident", lookahead=cfg.supply.lookahead)
    return cfg


CHECKED = ("tiered", "spill", "ps-direct", "collaborative", "resume")


def placement_configs(cfg: Config, steps: int) -> dict[str, Config]:
    """``cfg`` on the reference (``resident``) and on each placement ``cosparse check`` compares
    with it: ``tiered`` (a device tier of 10% of the rows the run touches, at least the rows of
    the batches in flight), ``spill`` (that device tier over a host tier of a quarter of them,
    whose victims spill to the PS), ``ps-direct``, ``collaborative`` (those tiers, the data
    workers delivering), and ``resume`` (the tiered placement, which the check saves mid-run
    and resumes). Each keeps the config's ``supply.lookahead``."""
    lookahead = cfg.supply.lookahead
    st = trace_stats(cfg, lookahead, steps)
    touched = max((v[0] for v in st.values()), default=0)
    window = max((v[1] for v in st.values()), default=0)
    device = max(touched // 10, window, 1)
    host = max(touched // 4, 2 * device)
    policy = cfg.store.device.policy
    workers = cfg.data.workers
    base = resident(cfg)
    tier = tiered(base, device, lookahead, workers, policy)
    return {
        "resident": base,
        "tiered": tier,
        "spill": tiered(base, device, lookahead, workers, policy, host_rows=host,
                        spill_to="remote"),
        "ps-direct": ps_direct(base, 2, 1),
        "collaborative": collaborative(base, device, host, lookahead, workers),
        "resume": copy.deepcopy(tier),
    }
