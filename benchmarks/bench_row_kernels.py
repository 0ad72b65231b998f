"""Row kernels of the in-memory step, alone (issue 35): the pooled lookup as the engine runs it
against a fused lookup straight from the slab, and new-row initialisation into fresh memory, into
memory populated ahead, and against a memset of the same bytes.

Workload: ``bench_inmemory``'s batches (the same generator and seed), each table's ID work done
by the engine's ``Deduper``, every unique ID given a distinct random slot of a ``rows``-row slab.

* ``lookup.engine``: ``ResidentTable.gather`` into its reused compact buffer, then
  ``F.embedding_bag`` over it (``cosparse.nn.pooled_lookup``'s forward).
* ``lookup.fused``: one numba kernel pooling each bag straight from the slab by slot (no compact
  buffer), the candidate of issue 35's item 3. Checked bit-identical to ``lookup.engine`` (sum).
* ``update.engine``: the backward as the engine runs it (``F.embedding_bag`` over the transposed
  index into a row-gradient buffer, ``cosparse.nn.pooled_lookup``) then ``update_checked``'s
  row-wise Adagrad from the gathered rows into the slab.
* ``update.fused``: one numba kernel summing each unique row's gradient from the pooled
  gradients, in sample order, and applying row-wise Adagrad to the slab in the same pass (the
  other half of item 3). Checked bit-identical to ``update.engine``, sum and mean pooling.
* ``init.fresh`` / ``init.populated`` / ``memset``: ``initial_rows`` of a step's new rows into a
  slab's fresh pages, into pages ``cosparse.store.prefault`` populated first, and a memset of the
  same bytes into populated pages.

Each figure is the median of ``repeats`` alternating repeats (ms); ratios are within this run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import numba
import numpy as np
from numba import prange

from benchmarks import common
from benchmarks.inmemory_worker import BenchConfig
from cosparse.optim import kernels as optim_kernels


@numba.njit(parallel=True, nogil=True, cache=True)
def pool_from_slab(slab, slots, inverse, offsets, dim, out):
    """out[b] = sum of slab[slots[inverse[j]], :dim] over bag b's IDs j, in order."""
    for b in prange(offsets.shape[0] - 1):
        for c in range(dim):
            out[b, c] = np.float32(0.0)
        for j in range(offsets[b], offsets[b + 1]):
            r = slots[inverse[j]]
            for c in range(dim):
                out[b, c] += slab[r, c]


@numba.njit(parallel=True, nogil=True, cache=True)
def backward_rowwise_adagrad(w, s, grad_out, t_offsets, t_bags, t_weights, mean, slab, slots,
                             lr, eps, l2):
    """Row u's gradient (its occurrences' pooled gradients, in order, times ``t_weights`` when
    ``mean``) summed into a four-row scratch, then row-wise Adagrad from ``w``/``s`` into
    ``slab[slots[u]]``: the backward and the update in one pass, no row-gradient buffer."""
    dim = w.shape[1]
    for q in prange((w.shape[0] + 3) // 4):
        g = np.zeros((4, dim), dtype=np.float32)
        u0 = 4 * q
        n = min(4, w.shape[0] - u0)
        for k in range(n):
            for j in range(t_offsets[u0 + k], t_offsets[u0 + k + 1]):
                wt = np.float64(t_weights[j])
                for c in range(dim):
                    if mean:  # as FBGEMM's weighted sum: the product exact, as in a fused multiply-add
                        g[k, c] = np.float32(wt * grad_out[t_bags[j], c] + g[k, c])
                    else:
                        g[k, c] += grad_out[t_bags[j], c]
        if n == 4:
            optim_kernels.rowwise_adagrad_4(w, s, 0, u0, u0 + 1, u0 + 2, u0 + 3, g, 0, slab,
                                            slots[u0], slots[u0 + 1], slots[u0 + 2],
                                            slots[u0 + 3], dim, lr, eps, l2)
        else:
            for k in range(n):
                optim_kernels.rowwise_adagrad_row(w, s, 0, u0 + k, g, k, slab, slots[u0 + k],
                                                  dim, lr, eps, l2)


def update_work(cfg: BenchConfig, pooling: str, rng: np.random.Generator) -> list[tuple]:
    """Per table: its slab, the batch's ID work, distinct random slots, random pooled gradients
    and the rows and state as gathered (the undo copy the update reads)."""
    import torch

    from cosparse.store.dedup import Deduper, table_ids
    from cosparse.store.kernels import gather_rows
    from cosparse.store.resident import ResidentTable

    batch = common.sparse_batches(cfg, common.make_batches(cfg, 1))[0]
    work = []
    for t in (ResidentTable(t, torch.device("cpu")) for t in common.table_configs(cfg)):
        ids = table_ids(batch, t.cfg.features, None, pooling, Deduper())
        slab = t.slab_array
        slab[: cfg.rows, : t.dim] = rng.standard_normal((cfg.rows, t.dim), dtype=np.float32)
        slab[: cfg.rows, t.dim:] = np.float32(0.1)
        slots = rng.choice(cfg.rows, ids.num_unique, replace=False).astype(np.int64)
        grad_out = 0.01 * rng.standard_normal((ids.offsets.shape[0] - 1, t.dim),
                                              dtype=np.float32)
        w = np.empty((ids.num_unique, t.dim), dtype=np.float32)
        s = np.empty((ids.num_unique, t.width - t.dim), dtype=np.float32)
        gather_rows(slab, slots, t.dim, w, s)
        work.append((slab, ids, slots, grad_out, w, s))
    return work


_HYPER = (np.float32(0.01), np.float32(1e-8), np.float32(0.0))  # lr, eps, l2


def update_engine(work: list[tuple], mean: bool) -> None:
    """The engine's backward (transposed ``embedding_bag``) then its ``update_checked``."""
    import torch
    import torch.nn.functional as F

    one = np.float32(1.0)
    for slab, ids, slots, grad_out, w, s in work:
        g = F.embedding_bag(torch.from_numpy(ids.t_bags), torch.from_numpy(grad_out),
                            torch.from_numpy(ids.t_offsets), mode="sum",
                            per_sample_weights=torch.from_numpy(ids.t_weights) if mean else None,
                            include_last_offset=True)
        optim_kernels.update_checked(optim_kernels.ROWWISE_ADAGRAD, w, s, g.numpy(), slab, slots,
                                     *_HYPER, one, one, one, one)


def update_fused(work: list[tuple], mean: bool) -> None:
    for slab, ids, slots, grad_out, w, s in work:
        backward_rowwise_adagrad(w, s, grad_out, ids.t_offsets, ids.t_bags, ids.t_weights, mean,
                                 slab, slots, *_HYPER)


def update_case(cfg: BenchConfig, repeats: int) -> dict[str, Any]:
    rng = np.random.default_rng(cfg.seed)
    out: dict[str, Any] = {}
    for pooling in ("mean", "sum"):  # timed below: the last, sum pooling (bench_inmemory's)
        work, mean = update_work(cfg, pooling, rng), pooling == "mean"
        update_engine(work, mean)  # (each pass writes the same rows from the same w, s)
        by_engine = [slab[slots].copy() for slab, _, slots, *_ in work]
        update_fused(work, mean)
        out[f"update_bit_identical_{pooling}"] = all(
            np.array_equal(a, slab[slots])
            for a, (slab, _, slots, *_) in zip(by_engine, work, strict=True))
    times = alternate({"update.engine": lambda: update_engine(work, mean),
                       "update.fused": lambda: update_fused(work, mean)}, repeats)
    return {**out, **times, "update_fused_over_engine": round(times["update.fused"]
                                                              / times["update.engine"], 3)}


def lookup_case(cfg: BenchConfig, repeats: int) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from cosparse.store.dedup import Deduper, table_ids
    from cosparse.store.resident import ResidentTable

    batch = common.sparse_batches(cfg, common.make_batches(cfg, 1))[0]
    rng = np.random.default_rng(cfg.seed)
    tables = [ResidentTable(t, torch.device("cpu")) for t in common.table_configs(cfg)]
    work = []
    for t in tables:
        ids = table_ids(batch, t.cfg.features, None, "sum", Deduper())
        slab = t.slab_array
        slab[: cfg.rows] = rng.standard_normal((cfg.rows, t.width), dtype=np.float32)
        slots = rng.choice(cfg.rows, ids.num_unique, replace=False).astype(np.int64)
        work.append((t, ids, slots))

    def engine() -> list[Any]:
        out = []
        for t, ids, slots in work:
            w, _ = t.gather(slots)
            out.append(F.embedding_bag(torch.from_numpy(ids.inverse), w,
                                       torch.from_numpy(ids.offsets), mode="sum",
                                       include_last_offset=True))
        return out

    def fused() -> list[Any]:
        out = []
        for t, ids, slots in work:
            pooled = np.empty((ids.offsets.shape[0] - 1, t.dim), dtype=np.float32)
            pool_from_slab(t.slab_array, slots, ids.inverse, ids.offsets, t.dim, pooled)
            out.append(torch.from_numpy(pooled))
        return out

    same = all(torch.equal(a, b) for a, b in zip(engine(), fused(), strict=True))
    times = alternate({"lookup.engine": engine, "lookup.fused": fused}, repeats)
    return {**times, "lookup_fused_over_engine": round(times["lookup.fused"]
                                                       / times["lookup.engine"], 3),
            "lookup_bit_identical": same,
            "unique_ids_per_table": round(statistics.fmean(w[1].num_unique for w in work))}


def init_case(cfg: BenchConfig, new_rows: int, repeats: int) -> dict[str, Any]:
    import torch

    from cosparse.store import prefault
    from cosparse.store.resident import ResidentTable

    t = ResidentTable(common.table_configs(cfg)[0], torch.device("cpu"))
    ids = np.random.default_rng(cfg.seed).integers(0, 1 << 40, new_rows)
    t.initial_rows(ids)  # compiled before the clock

    def fresh_slab() -> np.ndarray:
        return np.empty((cfg.rows, t.width), dtype=np.float32)

    def fresh() -> None:
        t.initial_rows(ids, out=fresh_slab()[:new_rows])

    def populated() -> float:
        slab = fresh_slab()
        prefault.populate(slab.ctypes.data, new_rows * slab.strides[0])
        t0 = time.perf_counter()
        t.initial_rows(ids, out=slab[:new_rows])
        return time.perf_counter() - t0  # (the populate is off the clock: it runs ahead)

    def memset() -> float:
        slab = fresh_slab()
        prefault.populate(slab.ctypes.data, new_rows * slab.strides[0])
        t0 = time.perf_counter()
        slab[:new_rows].fill(0.0)
        return time.perf_counter() - t0

    times = alternate({"init.fresh": fresh, "init.populated": populated, "memset": memset},
                      repeats)
    return {**times, "new_rows": new_rows, "row_bytes": t.row_bytes,
            "init_populated_over_fresh": round(times["init.populated"] / times["init.fresh"], 3),
            "init_populated_over_memset": round(times["init.populated"] / times["memset"], 3)}


def alternate(cases: dict[str, Any], repeats: int) -> dict[str, float]:
    """Median ms of each case over ``repeats`` rounds, the cases alternating in every round (a
    case may return its own timed seconds)."""
    got: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(repeats):
        for k, fn in cases.items():
            t0 = time.perf_counter()
            own = fn()
            got[k].append(own if isinstance(own, float) else time.perf_counter() - t0)
    return {k: round(1e3 * statistics.median(v), 3) for k, v in got.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="100k-row tables, 5 repeats: < 60 s")
    ap.add_argument("--tiny", action="store_true",
                    help="smoke-test size: 2 tables x 10k rows, batch 256, 2 repeats")
    ap.add_argument("--repeats", type=int, help="alternating repeats (default 15, quick 5)")
    ap.add_argument("--new-rows", type=int, default=40_000, help="rows one init call creates")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv)
    cfg = BenchConfig(rows=100_000 if a.quick else 1_000_000)
    if a.tiny:
        cfg = BenchConfig(tables=2, rows=10_000, batch=256)
    repeats = a.repeats or (2 if a.tiny else 5 if a.quick else 15)
    t0 = time.perf_counter()
    out: dict[str, Any] = {"config": {"tables": cfg.tables, "rows": cfg.rows, "dim": cfg.dim,
                                      "batch": cfg.batch, "repeats": repeats,
                                      "numba_threads": numba.get_num_threads()},
                           "machine": common.machine_info()}
    out.update(lookup_case(cfg, repeats))
    out.update(update_case(cfg, repeats))
    out.update(init_case(cfg, min(a.new_rows, cfg.rows), repeats))
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    for k, v in out.items():
        if k != "machine":
            print(f"{k} = {v}")
    if a.json:
        common.write_json(a.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
