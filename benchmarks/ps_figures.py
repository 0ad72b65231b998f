"""bench_ps' figures from the workers' results: the shards' rows per core-second, the bytes per
live row, the pinned pair's ratio, and the goals."""

from __future__ import annotations

from typing import Any

from benchmarks import common
from benchmarks.ps_worker import OVERHEAD_B_PER_ROW, SHARD_ROWS_PER_CORE_S, PSBenchConfig


def shard_rows_per_core(d: dict[str, Any]) -> dict[str, Any]:
    """Rows the shards served per second of their own CPU time, for PULL and for PUSH.

    The shards' CPU time is utime + stime of their processes (every thread) over the timed rounds;
    it is split between the ops in proportion to the CPU seconds the serving thread spent answering
    each op (STATS ``cpu_s_by_op``), so the rest (the poll loop, ZeroMQ's I/O thread, heartbeats)
    is shared out the same way. Rows are the IDs of the shards' request accounting."""
    cpu = sum(d["shard_cpu_s"])
    ops: dict[str, dict[str, float]] = {}
    for o in d["shard_ops"]:
        for op, v in o.items():
            acc = ops.setdefault(op, {"cpu_s": 0.0, "rows": 0, "requests": 0})
            for k in acc:
                acc[k] += v.get(k, 0)
    served = sum(v["cpu_s"] for v in ops.values())
    out: dict[str, Any] = {}
    for key, op in (("pull", "PULL"), ("push", "PUSH")):
        o = ops.get(op, {"cpu_s": 0.0, "rows": 0, "requests": 0})
        core_s = cpu * o["cpu_s"] / served if served > 0 else 0.0
        out[key] = round(o["rows"] / core_s) if core_s > 0 and o["rows"] > 0 else None
        out[f"{key}_serving_thread_only"] = (round(o["rows"] / o["cpu_s"])
                                             if o["cpu_s"] > 0 and o["rows"] > 0 else None)
        out[f"{key}_rows"] = int(o["rows"])
        out[f"{key}_requests"] = int(o["requests"])
        out[f"{key}_core_s"] = round(core_s, 4)
    out["shard_cpu_s"] = round(cpu, 3)
    out["serving_thread_cpu_s_by_op"] = {op: round(v["cpu_s"], 4) for op, v in sorted(ops.items())}
    out["serving_fraction"] = round(served / cpu, 3) if cpu > 0 else None
    out["target"] = SHARD_ROWS_PER_CORE_S
    out["method"] = ("rows served (the shards' request accounting: IDs of PULL requests, PEEKs "
                     "included, and of PUSH requests) / the shard CPU seconds attributed to that "
                     "op, over the timed rounds: the shard processes' utime+stime (/proc, every "
                     "thread) split between ops in proportion to the serving thread's CPU time "
                     "answering each op (STATS cpu_s_by_op: decode, shard work, encode, send); "
                     "*_serving_thread_only divides by that thread time alone")
    return out


def row_overhead(shard_stats: Any) -> dict[str, Any]:
    """Bytes per live row the shards hold beyond the row and its optimizer state (their STATS,
    ``ShardTable.overhead_bytes``), at the end of the run."""
    if not isinstance(shard_stats, list):
        return {"value": None, "error": f"no shard STATS: {shard_stats}"}
    tabs = [t for st in shard_stats for t in st["tables"].values()]
    rows = sum(t["rows"] for t in tabs)
    over = sum(t["overhead_bytes"] for t in tabs)
    slab = sum(t["slab_bytes"] for t in tabs)
    live = sum(t["bytes"] for t in tabs)
    value = round(over / rows, 1) if rows else None
    return {"value": value, "target": OVERHEAD_B_PER_ROW,
            "live_rows": rows, "overhead_bytes": over,
            "row_and_state_bytes_per_row": round(live / rows, 1) if rows else None,
            "slab_slack_bytes_per_row": round((slab - live) / rows, 1) if rows else None,
            "definition": "sum over the shards' tables of ShardTable.overhead_bytes() (nbytes of "
                          "the ID->slot map, the per-slot versions and flags, and the "
                          "per-request scratch, all at their allocated capacity) / live rows; the "
                          "slab's free slots are reported apart (slab_slack_bytes_per_row), not in "
                          "value"}


def pinned_ratio(cfg: PSBenchConfig, res: dict[str, Any], losses: dict[str, dict[int, float]]
                 ) -> dict[str, Any]:
    """A over all-resident with A's one shard alone on one core and each trainer on another."""
    if not cfg.pinned:
        return {"skipped": "not run: the pinned pair runs in the full run unless --no-pinned, "
                           "and with --quick / --tiny only with --pinned (it does not fit "
                           "--quick's 60 s); it needs 2 CPUs"}
    a, b = res["ps_pinned"]["sps"], res["resident_pinned"]["sps"]
    both = sorted(set(losses["ps_pinned"]) & set(losses["resident_pinned"]))
    return {
        "ratio": round(common.median(a) / common.median(b), 3),
        "ratio_paired": round(common.median(x / y for x, y in zip(a, b, strict=True)), 3),
        "samples_per_s": {"ps_pinned": common.spread(a), "resident_pinned": common.spread(b)},
        "shard_cpu_cores": round(common.median(res["ps_pinned"]["shard_cores"]), 2),
        "losses_identical": bool(both) and all(losses["ps_pinned"][i] == losses["resident_pinned"][i]
                                               for i in both),
        "setup": "ps_pinned: 1 PS shard, every thread of it on the second CPU; its trainer "
                 "(1 torch / numba thread, prefetch thread included) on the first; "
                 "resident_pinned: all rows resident, on the first CPU, 1 thread",
    }


def targets(out: dict[str, Any]) -> dict[str, Any]:
    """Issue 17's goals for this benchmark: value, target, and whether it is met."""
    t: dict[str, Any] = {}
    rp = out["shard_rows_per_core_s"]
    for k in ("pull", "push"):
        v = rp[k]
        t[f"shard_rows_per_core_s.{k}>={SHARD_ROWS_PER_CORE_S:.0e}"] = {
            "value": v, "target": SHARD_ROWS_PER_CORE_S, "pass": v is not None and v >= rp["target"]}
    v = out["bytes_per_row_overhead"]["value"]
    t[f"bytes_per_row_overhead<={OVERHEAD_B_PER_ROW}"] = {
        "value": v, "target": OVERHEAD_B_PER_ROW, "pass": v is not None and v <= OVERHEAD_B_PER_ROW}
    return t
