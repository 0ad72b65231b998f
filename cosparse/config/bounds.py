"""The allowed range of every numeric config value, checked in one pass at start-up.

``BOUNDS`` maps each numeric key, with list indices written ``[*]``, to its range: a value
outside it (or a NaN, an infinity, an integer beyond int64) is a configuration error naming the
dotted key. Every numeric field of the config has an entry; a test keeps it that way, so a new
field cannot skip validation. Cross-field rules (``init.low <= init.high``, DLRM's layer widths)
are in each section's validator, next to its dataclass.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class Bound:
    """A range ``lo .. hi`` of finite numbers; either end may be open or absent."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def allows(self, v: float) -> bool:
        if not math.isfinite(v):
            return False
        if self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo):
            return False
        return self.hi is None or (v < self.hi if self.hi_open else v <= self.hi)

    def describe(self) -> str:
        if self.lo is None and self.hi is None:
            return "a finite number"
        if self.hi is None:
            if self.lo == 0 and self.lo_open:
                return "positive"
            return f"{'>' if self.lo_open else '>='} {_num(self.lo)}"
        if self.lo is None:
            return f"{'<' if self.hi_open else '<='} {_num(self.hi)}"
        return (f"in {'(' if self.lo_open else '['}{_num(self.lo)}, {_num(self.hi)}"
                f"{')' if self.hi_open else ']'}")


def _num(x: float | None) -> str:
    return str(int(x)) if x is not None and float(x).is_integer() else str(x)


FINITE = Bound()
POSITIVE = Bound(0, lo_open=True)
AT_LEAST_0 = Bound(0)
AT_LEAST_1 = Bound(1)
SEED = Bound(0)  # numpy seed sequences take non-negative integers
FRACTION = Bound(0, 1, hi_open=True)  # [0, 1)
RATE = Bound(0, 1, lo_open=True)  # (0, 1]
MAX_SEQ = Bound(1, 10_000)
PROCESSES = Bound(0, 1024)  # processes or threads a run starts: more is a typo, not a plan
ZIPF_VOCAB = Bound(1, 2**31)  # the synthetic Zipf table takes 8 bytes per ID
SLOTS = Bound(1, 2**31 - 1)  # rows of one table in one tier: slots are int32
BATCH = Bound(1, 2**24)  # samples per batch
WIDTH = Bound(1, 100_000)  # features, dense columns, layer widths, embedding dims

BOUNDS: dict[str, Bound] = {
    # data
    "data.batch_size": BATCH,
    "data.workers": PROCESSES,
    "data.queue_depth": Bound(1, 1024),
    "data.eval_fraction": FRACTION,
    "data.eval_batch_size": BATCH,
    "data.synthetic.num_features": WIDTH,
    "data.synthetic.num_dense": Bound(0, 100_000),
    "data.synthetic.vocab_size": ZIPF_VOCAB,
    "data.synthetic.alpha": POSITIVE,
    "data.synthetic.bag_min": Bound(0, 10_000),
    "data.synthetic.bag_max": Bound(0, 10_000),
    "data.synthetic.seed": SEED,
    "data.synthetic.num_batches": AT_LEAST_1,
    "data.synthetic.eval_batches": AT_LEAST_0,
    "data.events.max_len": MAX_SEQ,
    "data.events.min_history": AT_LEAST_0,
    "data.events.seed": SEED,
    "data.events.uniform_negatives": AT_LEAST_0,
    "data.events.synthetic.seq_len": MAX_SEQ,
    "data.events.synthetic.vocab_size": ZIPF_VOCAB,
    "data.events.synthetic.num_cates": AT_LEAST_1,
    "data.events.synthetic.num_users": AT_LEAST_1,
    "data.events.synthetic.alpha": POSITIVE,
    "data.events.synthetic.seed": SEED,
    "data.events.synthetic.num_batches": AT_LEAST_1,
    "data.events.synthetic.eval_batches": AT_LEAST_1,
    "data.csv.infer_rows": AT_LEAST_1,
    "data.columns.hash_seed": SEED,
    "data.columns.label.threshold": FINITE,  # (any rating or score scale)
    "data.split.eval_fraction": FRACTION,
    "data.split.seed": SEED,
    "data.split.at": Bound(-10**18, 10**18),  # (unix milliseconds reach 1e13)
    "data.shuffle.buffer": Bound(1, 2**31),
    "data.shuffle.seed": SEED,
    "data.negatives.per_positive": Bound(1, 1000),
    "data.negatives.eval_per_positive": Bound(1, 1000),
    "data.negatives.seed": SEED,
    "data.stream.poll_s": Bound(0, 60, lo_open=True),  # a bounded sleep between listings
    "data.stream.idle_timeout_s": POSITIVE,
    "data.stream.eval_window_rows": Bound(1, 2**31),
    # tables
    "tables[*].dim": WIDTH,
    "tables[*].seed": SEED,
    "tables[*].num_embeddings": SLOTS,
    "tables[*].hash_size": AT_LEAST_1,
    "tables[*].optimizer.lr": POSITIVE,
    "tables[*].optimizer.eps": POSITIVE,  # 0 divides 0 by 0 on a row whose gradient is 0
    "tables[*].optimizer.beta1": FRACTION,
    "tables[*].optimizer.beta2": FRACTION,
    "tables[*].optimizer.initial_accumulator": AT_LEAST_0,
    "tables[*].optimizer.l2": AT_LEAST_0,
    "tables[*].init.low": FINITE,
    "tables[*].init.high": FINITE,
    "tables[*].init.std": AT_LEAST_0,
    "tables[*].column_offset": AT_LEAST_0,
    "tables[*].rows_of[*]": AT_LEAST_0,
    # model
    "model.bottom[*]": WIDTH,
    "model.top[*]": WIDTH,
    "model.deep[*]": WIDTH,
    "model.cross_layers": Bound(0, 1000),
    "model.cross_rank": WIDTH,
    "model.din.attention[*]": WIDTH,
    "model.din.mlp[*]": WIDTH,
    "model.multitask.experts": Bound(0, 1000),  # (MMoE needs one: validate_multitask)
    "model.multitask.specific": Bound(1, 1000),
    "model.multitask.levels": Bound(1, 100),
    "model.multitask.expert[*]": WIDTH,
    "model.multitask.tower[*]": WIDTH,
    "model.two_tower.tower[*]": WIDTH,
    "model.sasrec.layers": Bound(1, 100),
    "model.sasrec.heads": Bound(1, 1024),
    "model.sasrec.inner": WIDTH,
    "model.dropout": FRACTION,
    "model.dense_optimizer.lr": AT_LEAST_0,  # 0: a frozen dense model (exactness checks)
    "model.dense_optimizer.weight_decay": AT_LEAST_0,
    # store, supply, network
    "store.device.budget_bytes": AT_LEAST_1,
    "store.device.rows": SLOTS,
    "store.host.budget_bytes": AT_LEAST_1,
    "store.host.rows": SLOTS,
    "store.remote.num_shards": Bound(1, 1024),
    "store.remote.max_rows": AT_LEAST_1,
    "store.remote.max_bytes": AT_LEAST_1,
    "store.remote.snapshot_keep": AT_LEAST_1,
    "store.remote.timeout_s": POSITIVE,
    "store.remote.heartbeat_s": POSITIVE,
    "store.decay": RATE,
    "store.probe_batches": AT_LEAST_1,
    "store.admit_after": AT_LEAST_0,
    "store.ttl_steps": AT_LEAST_0,
    "supply.lookahead": AT_LEAST_0,
    "supply.horizon": AT_LEAST_0,
    "supply.publish_every": AT_LEAST_1,
    "supply.publish_timeout_s": POSITIVE,
    "supply.max_stale_rate": RATE,
    "supply.filter_bits_per_row": AT_LEAST_1,
    "network.link_mbps": POSITIVE,
    "network.link_latency_ms": AT_LEAST_0,
    # parallel
    "parallel.ranks_per_node": AT_LEAST_1,
    "parallel.link_gbps": POSITIVE,
    "parallel.device_budget_bytes": AT_LEAST_1,
    "parallel.host_budget_bytes": AT_LEAST_1,
    "parallel.replicate_below_bytes": AT_LEAST_0,
    # train
    "train.steps": AT_LEAST_1,
    "train.epochs": AT_LEAST_1,
    "train.seed": SEED,
    "train.threads": Bound(1, 1024),
    "train.cpu.threads": Bound(1, 1024),
    "train.cpu.reserve_for_workers": Bound(0, 1024),
    "train.log_every": AT_LEAST_1,
    "train.eval_every": AT_LEAST_0,
    "train.stall_timeout_s": AT_LEAST_0,  # 0: wait without bound
    "train.checkpoint.every": AT_LEAST_0,
    "train.checkpoint.every_s": AT_LEAST_0,
    "train.checkpoint.keep": AT_LEAST_1,  # 0 would delete the checkpoint just written
    "train.autotune.every": AT_LEAST_1,  # (a multiple of log_every: validate_train)
    "train.autotune.device_budget": AT_LEAST_1,
    "train.autotune.host_budget": AT_LEAST_1,
    "train.autotune.min_gain": Bound(0, 10),  # a gain over 10x to keep a change is a typo
    "train.autotune.patience": AT_LEAST_0,  # 0: no limit
    "train.early_stop.patience": AT_LEAST_1,
    "train.early_stop.every": AT_LEAST_1,
    "train.timing_warmup_steps": AT_LEAST_0,
    "train.trace.slowest": AT_LEAST_1,
    "train.trace.steps[*]": AT_LEAST_1,
    "train.health.hit_rate_floor": Bound(0, 1),
    "train.health.intervals_below": AT_LEAST_1,
    "train.health.bound_sample_steps": AT_LEAST_1,
    "train.health.planner_wait_share": Bound(0, 1),
    "train.health.stale_drop_rate": Bound(0, 1),
    "objective.tasks.*.weight": AT_LEAST_0,
    "objective.tasks.*.delta": POSITIVE,
    "objective.tasks.*.temperature": POSITIVE,
    "objective.tasks.*.sampled_eval": AT_LEAST_0,
}


def numeric_leaves(obj: Any, key: str = "") -> Iterator[tuple[str, int | float]]:
    """(dotted key, value) of every int or float in a config dataclass, lists included."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from numeric_leaves(getattr(obj, f.name), f"{key}.{f.name}" if key else f.name)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from numeric_leaves(v, f"{key}[{i}]")
    elif isinstance(obj, dict):  # (named entries, such as objective.tasks.NAME)
        for k, v in obj.items():
            if dataclasses.is_dataclass(v):
                yield from numeric_leaves(v, f"{key}.{k}")
    elif isinstance(obj, int | float) and not isinstance(obj, bool):
        yield key, obj


def pattern_of(key: str) -> str:
    """``models[1].tables[0].dim`` -> ``tables[*].dim``, ``objective.tasks.ctr.weight`` ->
    ``objective.tasks.*.weight``: the BOUNDS entry of a dotted key."""
    key = re.sub(r"^objective\.tasks\.[^.]+\.", "objective.tasks.*.", key)
    return re.sub(r"^models\[\*\]\.(model\.)?", lambda m: m.group(1) or "",
                  re.sub(r"\[\d+\]", "[*]", key))


def first_violation(cfg: Any) -> str | None:
    """The message of the first numeric value of ``cfg`` outside its range, or None. A float
    must also be in range once rounded to float32, the precision of rows and kernels (1e300
    would be infinite there, and 1e-300 zero)."""
    for key, v in numeric_leaves(cfg):
        if isinstance(v, int) and not INT64_MIN <= v <= INT64_MAX:
            return f"{key}: {v} does not fit a 64-bit integer"
        bound = BOUNDS.get(pattern_of(key), FINITE)
        if not bound.allows(v):
            return f"{key}: must be {bound.describe()} (got {v})"
        if isinstance(v, float):
            with np.errstate(over="ignore", under="ignore"):
                v32 = float(np.float32(v))
            if not bound.allows(v32):
                return f"{key}: must be {bound.describe()} (got {v}, which is {v32} in float32)"
    return None
