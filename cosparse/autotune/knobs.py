"""The knobs of a start configuration (each with the values the agent may try, the start's
first) and their application to a config mapping.

- Exact knobs move rows and work between tiers, threads and processes but never change what is
  computed, so every trial trains the start's losses and rows bit for bit (the agent vetoes one
  that does not).
- Reordering knobs (world size, sharding) change the order of sums: a trial must end within the
  parallelism tolerance of the start.
- Semantic knobs change what the model learns: suggestions, applied only when allowed."""

from __future__ import annotations

import copy
from typing import Any

from cosparse.autotune.types import Knob
from cosparse.config import Config
from cosparse.config.mapping import set_dotted

PATHS = ("resident", "ps-tiered", "ps-direct", "collaborative")
EVERY_TABLE = "tables.*."  # a key under it is set on every table
WORLD = "launch.world_size"  # how a trial is launched (ranks of one torchrun), not a config key
SHARDING = "parallel.sharding.*"  # every table pinned to one sharding kind (auto: none)


def _with_start(start: Any, values: tuple[Any, ...]) -> tuple[Any, ...]:
    return (start, *[v for v in values if v != start])


def world(params: dict[str, Any]) -> int:
    """The ranks a trial of ``params`` runs on."""
    return int(params.get(WORLD, 1))


def reorders(params: dict[str, Any]) -> bool:
    """Whether ``params`` set a reordering knob off its start (one process, no pins)."""
    return world(params) > 1 or params.get(SHARDING, "auto") != "auto"


def exact_knobs(cfg: Config) -> list[Knob]:
    """The exact knobs that apply to ``cfg`` (its supply path and tiers)."""
    sp, store = cfg.supply, cfg.store
    knobs = [Knob("supply.lookahead", _with_start(sp.lookahead, (0, 1, 2, 4, 8))),
             Knob("data.workers", _with_start(cfg.data.workers, (0, 1, 2))),
             Knob("data.queue_depth", _with_start(cfg.data.queue_depth, (1, 2, 4, 8)))]
    if store.tiered and sp.path != "ps-direct":
        dev = store.device.rows
        if dev is not None:
            knobs.append(Knob("store.device.rows", _with_start(dev, tuple(
                dev * k for k in (2, 4, 8, 16)))))
        knobs.append(Knob("store.device.policy",
                          _with_start(store.device.policy, ("lru", "lfu", "hotness"))))
        knobs.append(Knob("supply.horizon", _with_start(sp.horizon, (0, 2, 8))))
    if store.tiered and store.host.rows is not None:
        host = store.host.rows
        knobs.append(Knob("store.host.rows", _with_start(host, tuple(host * k for k in (2, 4, 8)))))
        knobs.append(Knob("store.host.policy",
                          _with_start(store.host.policy, ("lru", "lfu", "hotness"))))
    if sp.path in ("ps-tiered", "collaborative"):  # the supply paths over the start's PS
        knobs.append(Knob("supply.path", _with_start(sp.path, PATHS)))
        knobs.append(Knob("store.remote.num_shards",
                          _with_start(store.remote.num_shards, (1, 2, 4))))
    if sp.path == "collaborative":
        knobs.append(Knob("supply.publish_every", _with_start(sp.publish_every, (1, 2, 4))))
    return knobs


def semantic_knobs(cfg: Config) -> list[Knob]:
    """The knobs that change what is computed (batch size, learning rates, admission, TTL):
    measured with their held-out AUC and log loss, suggested, applied only when allowed."""
    b, lr = cfg.data.batch_size, cfg.tables[0].optimizer.lr
    knobs = [Knob("data.batch_size", (b, b // 2, 2 * b), "semantic"),
             Knob("model.dense_optimizer.lr", _scaled(cfg.model.dense_optimizer.lr), "semantic")]
    if all(t.optimizer.lr == lr for t in cfg.tables):  # one rate for every table
        knobs.append(Knob(EVERY_TABLE + "optimizer.lr", _scaled(lr), "semantic"))
    store, path = cfg.store, cfg.supply.path
    if store.tiered and path not in ("ps-direct", "collaborative"):
        knobs.append(Knob("store.admit_after", _with_start(store.admit_after, (0, 2, 4)),
                          "semantic"))
    if store.tiered and not (store.host.spill and store.host.spill_to == "remote"):
        knobs.append(Knob("store.ttl_steps", _with_start(store.ttl_steps, (0, 500, 2000)),
                          "semantic"))
    return knobs


def reordering_knobs(cfg: Config, ranks: int) -> list[Knob]:
    """World sizes up to ``ranks`` (torchrun trials on this host) and every table's sharding
    (``auto``: the sharding planner's choice). They change the order of sums, so a trial must
    end within the parallelism tolerance of the start (``cosparse.autotune.tolerance``)."""
    if ranks < 2:
        return []
    kinds = ("auto", "row_wise", "table_wise", "column_wise", "table_row_wise", "data_parallel")
    return [Knob(WORLD, tuple(range(1, ranks + 1)), "reordering"),
            Knob(SHARDING, kinds, "reordering")]


def _scaled(value: float) -> tuple[float, ...]:
    return (value, value / 2, value * 2)



def apply(raw: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """A copy of the config mapping ``raw`` with the knobs' values set (a supply path with the
    store settings it needs: see ``_fit_store``; ``tables.*.KEY`` on every table)."""
    out = copy.deepcopy(raw)
    for key in [k for k in params if k.startswith(EVERY_TABLE)]:
        for table in out["tables"]:
            set_dotted(table, {key[len(EVERY_TABLE):]: params[key]})
    if params.get(SHARDING, "auto") != "auto":
        out.setdefault("parallel", {})["sharding"] = {t["name"]: params[SHARDING]
                                                      for t in out["tables"]}
    special = (EVERY_TABLE, "launch.", SHARDING)
    out = set_dotted(out, {k: v for k, v in params.items() if not k.startswith(special)})
    if "supply.path" in params:
        _fit_store(out)
    return out


def _fit_store(raw: dict[str, Any]) -> None:
    """The store that the mapping's supply path needs, in place: ``resident`` keeps every row in
    this process (an unbounded host tier, so its host bytes count the whole vocabulary),
    ``ps-direct`` (architecture A) keeps the device cache and no host tier, and the paths with
    tiers over the PS write host victims to it. Settings a path would refuse are dropped."""
    path = raw["supply"]["path"]
    store = raw.setdefault("store", {})
    host = store.get("host") or {}
    if path == "resident":
        store["host"] = {k: v for k, v in host.items() if k not in ("rows", "budget_bytes")}
        store["host"].update(spill=False, spill_to="memory")
    elif path == "ps-direct":
        store.pop("host", None)
        raw["supply"].pop("horizon", None)
    else:
        store["host"] = {**host, "spill": True, "spill_to": "remote"}
    if path != "collaborative":
        for key in ("publish_every", "fallback"):
            raw["supply"].pop(key, None)
