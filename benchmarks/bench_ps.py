"""Architecture A (ps-direct) vs the all-resident engine: DLRM training with every embedding row on
2 local parameter-server shards, against the same model with all rows resident in the trainer.

Workload: benchmarks.common's (8 tables x 1M x 64 fp32, Zipf 1.05 raw int64 IDs, bags 1..20,
batch 4096, DLRM 13-512-256-64 / 512-256-1, row-wise Adagrad on embeddings, Adagrad on dense).
``--quick`` / ``--tiny`` shrink it (see ``--help`` and benchmarks/README.md).

Contenders, each in its OWN worker process (benchmarks.common's protocol), ALTERNATING rounds:
  ps_direct  EmbeddingCollection over ps_tables(tables, client, lookahead=k): every table on the PS.
             The worker starts ``EmbeddedShards(shards, tables)``: real ``cosparse ps serve``
             processes, children of the worker, on the SAME cores as everything else. Each batch
             pulls its unique rows when it is planned (on the prefetch thread, up to k batches
             ahead), rows that a batch in flight will update are pulled right before the batch
             trains, and ``ec.apply_gradients()`` pushes the row gradients; the shards run the
             optimizer.
  resident   EmbeddingCollection(tables): all rows in the trainer process (the baseline).
Both train like the trainer: one long-lived ``Prefetcher(ec.staged(source, 0), identity,
lookahead)``, forward, BCE, backward, dense Adagrad step, ``ec.apply_gradients()``. The source is
*gated* (``GatedSource``, as in bench_tiers): during a round the prefetch thread may read at most
``lookahead`` batches past the round, so it does no work while the other contender is timed and
every timed round does steady-state work. Both contenders see the same batches in the same order
from the same seeds, so by the exactness invariant their losses must be identical
(``losses_identical``).
``--check-versions`` also checks every row ps_direct trains against the PS's version (a debug
PEEK per table and step: a stale row stops the run, naming it). Every process takes the hash
of the engine sources at its start, once ready and at the end: ``engine_sources_changed``
says that cosparse/ was edited during the run, so its processes may have run different code.

Figures come from the client's own counters (``PSClient.counters``: every byte on the sockets,
headers included). The worker wraps the client's request call (in its own process only) to split
the waits and requests by operation and by thread (prefetch thread vs trainer thread).
Issue 17's figures: ``shard_rows_per_core_s`` (rows served per second of the shards' own CPU
time, utime + stime split between PULL and PUSH by the serving thread's CPU per op, STATS
``cpu_s_by_op``), ``bytes_per_row_overhead`` (``ShardTable.overhead_bytes`` summed / live rows) and,
in the full run or with ``--pinned``, ``a_over_resident_pinned`` (one shard on its own core, the
trainer on the other; see benchmarks/README.md for the formulas).
Every shard process is stopped at the end and on errors; the parent checks that no ``ps serve``
process with this run's data directory remains (``shard_processes_left``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import common

CONTENDERS = ("ps_direct", "resident")
PINNED = ("ps_pinned", "resident_pinned")  # --pinned: 1 shard on its own core, trainers on another
MB = 1e6  # MB/s figures are 10^6 bytes per second
SHARD_ROWS_PER_CORE_S = 5e6  # issue 17's goal for PULL and for PUSH (Adagrad), rows per core-second
OVERHEAD_B_PER_ROW = 24  # issue 17's goal: bytes per live row beyond the row and its optimizer state


# ------------------------------------------------------------------------------------- config
@dataclasses.dataclass
class PSBenchConfig(common.Workload):
    warmup: int = 6  # untimed trained batches before round 0 (JIT, first-touch, vocab growth)
    steps: int = 8
    rounds: int = 7
    lookahead: int = 1
    shards: int = 2
    threads: int = 0
    check_versions: bool = False  # debug: every row checked against the PS's version (a PEEK)
    timeout_s: float = 120.0  # PS request timeout
    heartbeat_s: float = 1.0
    pinned: bool = True  # also run PINNED (--no-pinned: not; --quick / --tiny: off unless --pinned)

    @property
    def contenders(self) -> tuple[str, ...]:
        return CONTENDERS + PINNED if self.pinned else CONTENDERS

    @property
    def n_train(self) -> int:
        return self.warmup + self.rounds * self.steps

    @property
    def n_batches(self) -> int:  # the gate lets the last round plan `lookahead` batches past it
        return self.n_train + self.lookahead

    def round_start(self, r: int) -> int:
        return self.warmup + r * self.steps


# ------------------------------------------------------------------------- process helpers
def shard_processes(data_root: Path) -> list[int]:
    """PIDs of ``cosparse ps serve`` processes whose data directory lies under ``data_root``."""
    root = str(data_root)
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if "ps" in args and "serve" in args and any(a.startswith(root) for a in args):
            out.append(int(d.name))
    return out


def pin_cores() -> tuple[int, int] | None:
    """(trainer core, shard core) of the PINNED contenders: this process's first two CPUs, or None
    when it may run on fewer than two."""
    cpus = sorted(os.sched_getaffinity(0))
    return (cpus[0], cpus[1]) if len(cpus) >= 2 else None


def pin_threads(pid: int, core: int) -> None:
    """Every thread of process ``pid`` onto ``core``; threads it starts later inherit it."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), {core})
        except ProcessLookupError:  # a thread that just ended
            pass


# -------------------------------------------------------------------------------- the worker
class ClientProbe:
    """Splits a PSClient's wait time and requests by operation and by thread.

    Wraps the instance's ``_call`` and holds the client's (reentrant) lock around it, so one call
    at a time and the ``wait_s`` delta belongs to that call alone. Bytes come from the client's
    own counters.
    """

    def __init__(self, client: Any) -> None:
        from cosparse.ps import protocol as P

        self.names = dict(P.OP_NAMES)
        self.wait_s: dict[str, float] = defaultdict(float)
        self.requests: dict[str, int] = defaultdict(int)
        self.calls: dict[str, int] = defaultdict(int)
        self.client = client
        orig = client._call

        def probed(reqs: Any, timeout_s: float | None = None) -> Any:
            msgs = [m for _, m in reqs] if isinstance(reqs, list) else list(reqs.values())
            ops = {m.op for m in msgs}
            op = self.names.get(ops.pop(), "?") if len(ops) == 1 else "MIXED"
            where = "trainer" if threading.current_thread() is threading.main_thread() else "prefetch"
            with client._lock:
                w0 = client.counters.wait_s
                try:
                    return orig(reqs, timeout_s)
                finally:
                    key = f"{op}@{where}"
                    self.wait_s[key] += client.counters.wait_s - w0
                    self.requests[key] += len(msgs)
                    self.calls[key] += 1

        client._call = probed

    def snapshot(self) -> dict[str, Any]:
        c = self.client.counters
        return {"bytes_pull": c.bytes_pull, "bytes_push": c.bytes_push, "bytes_other": c.bytes_other,
                "requests": c.requests, "wait_s": c.wait_s, "wait_s_by": dict(self.wait_s),
                "requests_by": dict(self.requests), "calls_by": dict(self.calls)}


def _delta(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """b - a, recursively over numbers and dicts of numbers."""
    out: dict[str, Any] = {}
    for k, v in b.items():
        if isinstance(v, dict):
            out[k] = _delta(a.get(k, {}), v)
        else:
            out[k] = v - a.get(k, 0)
    return out


class PSContender:
    """EC + DLRM trained through one long-lived, gated Prefetcher; for ps_direct, owns the shards."""

    def __init__(self, name: str, cfg: PSBenchConfig, raw: list[common.Batch], ps_dir: Path,
                 shard_core: int | None = None) -> None:
        import torch

        from cosparse.nn.embedding import EmbeddingCollection
        from cosparse.train.prefetch import Prefetcher

        common.set_numba_threads(cfg.threads)
        self.name, self.cfg = name, cfg
        self.shards: Any = None
        self.client: Any = None
        self.probe: ClientProbe | None = None
        self.pf: Any = None
        tables = common.table_configs(cfg)
        if name in ("ps_direct", "ps_pinned"):
            from cosparse.ps import EmbeddedShards

            self.shards = EmbeddedShards(cfg.shards, tables=tables, data_dir=ps_dir)
            if shard_core is not None:  # ps_pinned: its shard alone on the other core
                for pid in self.shards.pids:
                    pin_threads(pid, shard_core)
            self.client = self.shards.client(timeout_s=cfg.timeout_s, heartbeat_s=cfg.heartbeat_s)
            self.probe = ClientProbe(self.client)
            from cosparse.supply.placements import ps_tables

            cpu = torch.device("cpu")
            placements = ps_tables(tables, cpu, self.client, cfg.lookahead,
                                   check_versions=cfg.check_versions)
            self.ec = EmbeddingCollection(tables, cpu, placements, lookahead=cfg.lookahead)
        elif name in ("resident", "resident_pinned"):
            self.ec = EmbeddingCollection(tables, device="cpu")
        else:
            raise ValueError(f"unknown contender {name!r}")
        torch.manual_seed(cfg.seed)
        self.model, self.opt = common.cosparse_dlrm(self.ec, cfg)
        self.gate = common.GatedSource(common.sparse_batches(cfg, raw))
        self.pf = Prefetcher(self.ec.staged(iter(self.gate), 0), lambda p: p, cfg.lookahead)
        self.it = iter(self.pf)
        self.trained = 0

    @property
    def shard_pids(self) -> list[int]:
        return list(self.shards.pids) if self.shards is not None else []

    def _rows(self) -> dict[str, int]:
        tabs = self.ec.tables.values()
        return {"pulled": sum(int(getattr(t, "pulled_rows", 0)) for t in tabs),
                "deferred": sum(int(getattr(t, "deferred_rows", 0)) for t in tabs)}

    def _shard_ops(self) -> dict[str, dict[str, float]]:
        """Per op, summed over the shards' STATS: the serving thread's CPU seconds (``cpu_s``) and
        the requests and rows of the shards' request accounting (every namespace)."""
        out: dict[str, dict[str, float]] = defaultdict(lambda: {"cpu_s": 0.0, "rows": 0, "requests": 0})
        for st in self.client.stats():
            for op, cpu in st.get("cpu_s_by_op", {}).items():
                out[op]["cpu_s"] += cpu
            for ns in st["namespaces"].values():
                for op, c in ns["ops"].items():
                    out[op]["rows"] += c["rows"]
                    out[op]["requests"] += c["requests"]
        return {k: dict(v) for k, v in out.items()}

    def train(self, start: int, n: int) -> dict[str, Any]:
        import torch.nn.functional as F

        if start != self.trained:
            raise RuntimeError(f"{self.name}: asked to train from batch {start}, next is {self.trained}")
        # plan at most `lookahead` batches past this round, as in steady state
        self.gate.allow(start + n + self.cfg.lookahead - 1)
        ops0 = self._shard_ops() if self.client is not None else {}  # (a STATS: before c0)
        c0 = self.probe.snapshot() if self.probe else {}
        r0 = self._rows()
        sh0 = sum(common.proc_cpu_s(p) for p in self.shard_pids)
        stage0 = dict(self.ec.stage_ms)
        wait0 = self.pf.wait_ms
        times, losses, uniques = [], [], []
        parts: dict[str, float] = defaultdict(float)
        t_first = last = time.perf_counter()
        for k in range(n):
            p = next(self.it)
            if p.batch.index != start + k:
                raise RuntimeError(f"{self.name}: got batch {p.batch.index}, expected {start + k}")
            t1 = time.perf_counter()
            self.opt.zero_grad(set_to_none=True)
            logits = self.model(p)
            loss = F.binary_cross_entropy_with_logits(logits, p.batch.labels)
            t2 = time.perf_counter()
            loss.backward()
            t3 = time.perf_counter()
            self.opt.step()
            t4 = time.perf_counter()
            self.ec.apply_gradients()
            now = time.perf_counter()
            parts["next_batch"] += t1 - last
            parts["forward(incl. gather/deferred pull)"] += t2 - t1
            parts["backward"] += t3 - t2
            parts["dense_opt"] += t4 - t3
            parts["apply_gradients(push)"] += now - t4
            times.append(now - last)
            last = now
            losses.append(float(loss.detach()))
            uniques.append(sum(t.num_unique for t in p.tables.values()))
        wall = time.perf_counter() - t_first
        shard_cpu = sum(common.proc_cpu_s(p) for p in self.shard_pids) - sh0
        client = _delta(c0, self.probe.snapshot()) if self.probe else None
        ops = _delta(ops0, self._shard_ops()) if self.client is not None else {}
        self.trained += n
        out: dict[str, Any] = {
            "step_s": times, "losses": losses, "round_wall_s": wall, "unique_rows": uniques,
            "step_parts_ms": {k: 1e3 * v / n for k, v in parts.items()},
            "wait_ms": self.pf.wait_ms - wait0,
            "stage_ms": {k: v - stage0.get(k, 0.0) for k, v in self.ec.stage_ms.items()},
            "shard_cpu_s": shard_cpu, "shard_ops": ops,
            "rows": _delta(r0, self._rows()),
        }
        if client is not None:
            out["client"] = client
        return out

    def stats(self) -> dict[str, Any]:
        import numba
        import torch

        info: dict[str, Any] = {"torch_threads": torch.get_num_threads(),
                                "numba_threads": numba.get_num_threads(),
                                "lookahead": self.cfg.lookahead,
                                "cores": sorted(os.sched_getaffinity(0))}
        if self.shards is not None:
            info["shard_cores"] = [sorted(os.sched_getaffinity(p)) for p in self.shard_pids]
            info["shards"] = self.cfg.shards
            info["shard_pids"] = self.shard_pids
            info["shard_peak_rss_mb"] = [round(common.proc_hwm_mb(p)) for p in self.shard_pids]
            info["client_totals"] = self.probe.snapshot() if self.probe else {}
            try:
                info["shard_stats"] = self.client.stats()
            except Exception as e:  # noqa: BLE001 - informational only
                info["shard_stats"] = f"{type(e).__name__}: {e}"
        else:
            info["rows_per_table"] = int(np.mean([t.num_rows for t in self.ec.tables.values()]))
        return info

    def close(self) -> None:
        """Stop the prefetch thread, then the client and every shard (always, in this order)."""
        try:
            self.gate.stop()
            self.ec.planner.cancel()
            if self.pf is not None:
                self.pf.close()
        finally:
            try:
                if self.client is not None:
                    self.client.close()
            finally:
                if self.shards is not None:
                    self.shards.close()


def serve_ps(name: str, cfg: PSBenchConfig, data: Path, ps_dir: Path) -> None:
    """Worker: load the batches the parent saved, build the contender (for ps_direct, start its
    shards), answer train / stats. The shards are stopped on every way out (``serve`` closes the
    contender on quit, at the end of stdin, on errors and on SIGTERM)."""

    cores = pin_cores() if name in PINNED else None
    if cores is not None:  # the trainer alone on one core, with one thread (before it starts any)
        pin_threads(os.getpid(), cores[0])
        cfg = dataclasses.replace(cfg, threads=1, shards=1 if name == "ps_pinned" else cfg.shards)
        ps_dir = ps_dir / "pinned"

    def setup() -> tuple[PSContender, dict[str, Any]]:
        common.set_threads(cfg.threads)
        t0 = time.perf_counter()
        fingerprint = common.engine_fingerprint()
        raw = common.load_batches(data)
        checksum = common.data_checksum(raw)
        rss_data = common.rss_mb()
        c = PSContender(name, cfg, raw, ps_dir, cores[1] if cores and name == "ps_pinned" else None)
        return c, {"checksum": checksum, "setup_s": round(time.perf_counter() - t0, 2),
                   "rss_after_data_mb": round(rss_data), "shard_pids": c.shard_pids,
                   "engine": [fingerprint, common.engine_fingerprint()]}

    common.serve(setup, {
        "train": lambda c, cmd: c.train(cmd["start"], cmd["n"]),
        "stats": lambda c, cmd: {**common.process_stats(c.stats()), "engine": common.engine_fingerprint()},
    })


# ------------------------------------------------------------------------------------ parent
def stop_leftovers(data_root: Path, wait_s: float = 10.0) -> list[int]:
    """Shard processes of this run still alive after the workers closed: wait, then kill them."""
    deadline = time.monotonic() + wait_s
    left = shard_processes(data_root)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = shard_processes(data_root)
    for pid in left:  # started (indirectly) by this run: its data dir is ours
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def run_bench(a: argparse.Namespace) -> dict[str, Any]:
    cfg = config_from_args(a)
    if cfg.pinned and pin_cores() is None:
        print("--pinned needs 2 CPUs (one for the trainer, one for the shard): skipped", flush=True)
        cfg = dataclasses.replace(cfg, pinned=False)
    env = common.worker_env(cfg.threads)
    cfg_json = json.dumps(dataclasses.asdict(cfg))
    machine = common.machine_info()
    print(f"config: {cfg_json}\n  trained batches {cfg.n_train} (warm-up {cfg.warmup}), "
          f"{cfg.shards} PS shards\nmachine: {json.dumps(machine)}", flush=True)
    t_start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="bench_ps_"))
    ps_dir = tmp / "ps"
    workers: dict[str, common.Worker] = {}
    left: list[int] = []
    try:
        t0 = time.perf_counter()
        raw = common.make_batches(cfg, cfg.n_batches)
        data = tmp / "batches.npz"
        common.save_batches(raw, data)
        checksum = common.data_checksum(raw)
        ipb = common.ids_per_batch(raw)
        del raw
        print(f"data: {cfg.n_batches} batches, {ipb:,.0f} IDs/batch, "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        for n in cfg.contenders:
            workers[n] = common.Worker(n, "benchmarks.bench_ps",
                                       ["--worker", n, "--config-json", cfg_json, "--data", str(data),
                                        "--ps-dir", str(ps_dir)], env)
        common.wait_ready(workers, lambda r: f"setup {r['setup_s']} s, pid {r['pid']}"
                                             + (f", shard pids {r['shard_pids']}" if r["shard_pids"] else ""),
                          checksum)

        machine["engine_sources_sha1"] = {n: list(w.ready["engine"]) for n, w in workers.items()}
        if _sources_changed(machine):
            print(f"WARNING: the workers run different engine sources "
                  f"{machine['engine_sources_sha1']} (cosparse/ edited during start-up)", flush=True)
        res: dict[str, dict[str, Any]] = {n: defaultdict(list) for n in cfg.contenders}
        losses: dict[str, dict[int, float]] = {n: {} for n in cfg.contenders}

        def call(n: str, start: int, steps: int, timed: bool) -> None:
            r, busy = workers[n].call_busy(cmd="train", start=start, n=steps)
            losses[n].update({start + k: v for k, v in enumerate(r["losses"])})
            if not timed:
                return
            d = res[n]
            d["sps"].append(steps * cfg.batch / sum(r["step_s"]))
            d["step_s"].extend(r["step_s"])
            d["round_wall_s"].append(r["round_wall_s"])
            d["shard_cores"].append(r["shard_cpu_s"] / r["wall_s"])
            d["shard_cpu_s"].append(r["shard_cpu_s"])
            d["shard_ops"].append(r["shard_ops"])
            d["worker_cores"].append(r["cpu_s"] / r["wall_s"])
            d["other_cpu"].append(common.other_cores(busy, r, r["shard_cpu_s"]))
            d["wait_ms"].append(r["wait_ms"] / steps)
            d["stage_ms"].append({k: v / steps for k, v in r["stage_ms"].items()})
            d["step_parts_ms"].append(r["step_parts_ms"])
            d["unique_rows"].extend(r["unique_rows"])
            d["rows"].append(r["rows"])
            if "client" in r:
                d["client"].append(r["client"])

        for n in cfg.contenders:  # warm-up: JIT in workers and shards, allocator, vocabulary growth
            call(n, 0, cfg.warmup, timed=False)
        for r in range(cfg.rounds):
            for n in common.rotation(cfg.contenders, r):
                call(n, cfg.round_start(r), cfg.steps, timed=True)
            line = "  ".join(f"{n} {res[n]['sps'][-1]:,.0f}" for n in cfg.contenders)
            print(f"round {r + 1}/{cfg.rounds} samples/s: {line}  (shards used "
                  f"{res['ps_direct']['shard_cores'][-1]:.2f} cores)", flush=True)
        stats = {n: w.call(cmd="stats") for n, w in workers.items()}
        for n in cfg.contenders:  # start, ready (shards up), end
            machine["engine_sources_sha1"][n].append(stats[n]["engine"])
    finally:
        common.close_all(workers)
        left = stop_leftovers(ps_dir)
        shutil.rmtree(tmp, ignore_errors=True)
    machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    return assemble(cfg, res, losses, stats, machine, ipb, left, t_start)


def _sources_changed(machine: dict[str, Any]) -> bool:
    """Whether any process of the run saw other engine sources than the others, at any point."""
    return len({h for hs in machine["engine_sources_sha1"].values() for h in hs}) > 1


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


def assemble(cfg: PSBenchConfig, res: dict[str, Any], losses: dict[str, dict[int, float]],
             stats: dict[str, Any], machine: dict[str, Any], ipb: float,
             left: list[int], t_start: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["samples_per_s"] = {n: common.spread(res[n]["sps"]) for n in CONTENDERS}
    med = {n: out["samples_per_s"][n]["median"] for n in CONTENDERS}
    out["ratio"] = round(med["ps_direct"] / med["resident"], 3)
    out["ratio_paired"] = round(common.median(x / y for x, y in zip(res["ps_direct"]["sps"],
                                                                    res["resident"]["sps"], strict=True)), 3)
    d = res["ps_direct"]
    steps = cfg.rounds * cfg.steps
    tot = {k: sum(c[k] for c in d["client"]) for k in ("bytes_pull", "bytes_push", "bytes_other",
                                                       "requests", "wait_s")}
    by_wait: dict[str, float] = defaultdict(float)
    by_req: dict[str, int] = defaultdict(int)
    for c in d["client"]:  # (the STATS of the shards' per-op figures are outside the rounds)
        for k, v in c["wait_s_by"].items():
            if not k.startswith("STATS@"):
                by_wait[k] += v
        for k, v in c["requests_by"].items():
            if not k.startswith("STATS@"):
                by_req[k] += v
    pull_wait = sum(v for k, v in by_wait.items() if k.startswith("PULL@"))
    push_wait = sum(v for k, v in by_wait.items() if k.startswith("PUSH@"))
    wall = sum(d["round_wall_s"])
    pulled = sum(r["pulled"] for r in d["rows"])
    deferred = sum(r["deferred"] for r in d["rows"])
    unique = sum(d["unique_rows"])
    row_b = cfg.dim * 4
    out["bytes"] = {"trainer_ps": {
        "pull_per_step": round(tot["bytes_pull"] / steps),
        "push_per_step": round(tot["bytes_push"] / steps),
        "other_per_step": round(tot["bytes_other"] / steps),
        "total_per_step": round((tot["bytes_pull"] + tot["bytes_push"] + tot["bytes_other"]) / steps),
        "pull_row_payload_per_step": round(pulled * row_b / steps),
        "push_grad_payload_per_step": round(unique * row_b / steps),
        "pull_bytes_per_pulled_row": round(tot["bytes_pull"] / max(pulled, 1), 1),
        "push_bytes_per_pushed_row": round(tot["bytes_push"] / max(unique, 1), 1),
        "source": "PSClient.counters (every socket byte, headers included), summed over the "
                  "timed rounds / timed steps",
    }}
    out["ps_pull_mb_per_s"] = {
        "over_pull_wait": round(tot["bytes_pull"] / MB / max(pull_wait, 1e-9), 1),
        "over_wall": round(tot["bytes_pull"] / MB / max(wall, 1e-9), 1),
        "push_over_push_wait": round(tot["bytes_push"] / MB / max(push_wait, 1e-9), 1),
        "definition": "pull bytes (10^6 B) / seconds the client waited for PULL replies (after "
                      "sending, both threads), and / wall time of the timed rounds",
    }
    out["requests_per_step"] = {
        "total": round(tot["requests"] / steps, 2),
        **{k: round(v / steps, 2) for k, v in sorted(by_req.items())},
    }
    out["ps_wait_ms_per_step"] = {
        "total": round(1e3 * tot["wait_s"] / steps, 2),
        "pull": round(1e3 * pull_wait / steps, 2),
        "push": round(1e3 * push_wait / steps, 2),
        **{k: round(1e3 * v / steps, 2) for k, v in sorted(by_wait.items())},
        "note": "PULL@prefetch overlaps training (rows of the next batch); PULL@trainer (rows a "
                "batch in flight updated, pulled right before the batch trains) and PUSH@trainer "
                "are on the step's critical path",
    }
    out["rows_per_step"] = {"unique": round(unique / steps), "pulled": round(pulled / steps),
                            "deferred_then_pulled": round(deferred / steps),
                            "deferred_fraction": round(deferred / max(unique, 1), 4)}
    out["shard_cpu_cores"] = {"median": round(common.median(d["shard_cores"]), 2),
                              "rounds": [round(x, 2) for x in d["shard_cores"]]}
    both = sorted(set(losses["ps_direct"]) & set(losses["resident"]))
    diffs = [abs(losses["ps_direct"][i] - losses["resident"][i]) for i in both]
    out["losses_identical"] = bool(both) and max(diffs) == 0.0
    out["engine_sources_changed"] = _sources_changed(machine)
    out["loss_max_abs_diff"] = max(diffs) if diffs else None
    left_now = [p for p in left if Path(f"/proc/{p}").exists()]
    out["shard_processes_left"] = len(left_now)
    out["shard_processes_killed_by_parent"] = len(left)
    out["shard_rows_per_core_s"] = shard_rows_per_core(d)
    out["bytes_per_row_overhead"] = row_overhead(stats["ps_direct"]["info"].get("shard_stats"))
    out["a_over_resident_pinned"] = pinned_ratio(cfg, res, losses)
    out["targets"] = targets(out)
    per: dict[str, Any] = {}
    for n in cfg.contenders:
        r = res[n]
        part_keys = list(r["step_parts_ms"][0]) if r["step_parts_ms"] else []  # in step order
        per[n] = {
            "samples_per_s": common.spread(r["sps"]),
            **common.step_ms(r["step_s"]),
            "trainer_wait_ms_per_step": [round(x, 1) for x in r["wait_ms"]],
            "stage_ms_per_step": common.median_by_key(r["stage_ms"]),
            "step_parts_ms": {k: round(common.median(s[k] for s in r["step_parts_ms"]), 1)
                              for k in part_keys},
            "worker_cpu_cores": [round(x, 2) for x in r["worker_cores"]],
            "other_cpu_cores": [round(x, 2) for x in r["other_cpu"]],
            "loss_last": losses[n][max(losses[n])] if losses[n] else None,
            "peak_rss_mb": stats[n]["peak_rss_mb"],
            "info": stats[n]["info"],
        }
    for n in ("ps_direct", "ps_pinned"):
        if n in per:
            per[n]["shard_cpu_cores"] = [round(x, 2) for x in res[n]["shard_cores"]]
    out["contenders"] = per
    out["config"] = {**dataclasses.asdict(cfg), "ids_per_batch": round(ipb),
                     "order": "alternating rounds (start rotated each round); one worker process "
                              "per contender; the ps_direct worker's shards are its child processes; "
                              "gated long-lived Prefetcher per contender"}
    out["machine"] = machine
    out["wall_s"] = round(time.perf_counter() - t_start, 1)
    print_report(out)
    return out


def print_report(out: dict[str, Any]) -> None:
    print(f"\n{'contender':<12}{'samples/s':>11}{'min-max':>17}{'step p50 ms':>13}"
          f"{'worker cores':>14}{'shard cores':>13}{'other cpu':>11}")
    for n, p in out["contenders"].items():
        s = p["samples_per_s"]
        sh = common.median(p["shard_cpu_cores"]) if "shard_cpu_cores" in p else 0.0
        rng = f"{s['min']:,}-{s['max']:,}"
        print(f"{n:<12}{s['median']:>11,}{rng:>17}{p['step_ms_p50']:>13}"
              f"{common.median(p['worker_cpu_cores']):>14.2f}{sh:>13.2f}{max(p['other_cpu_cores']):>11}")
    for n, p in out["contenders"].items():
        print(f"  {n} step parts (ms/step, median over rounds): {p['step_parts_ms']}")
    print()
    print(f"ratio (ps_direct / resident) = {out['ratio']}  (paired {out['ratio_paired']})")
    b = out["bytes"]["trainer_ps"]
    print(f"bytes.trainer_ps per step: pull {b['pull_per_step']:,}  push {b['push_per_step']:,}  "
          f"other {b['other_per_step']:,}  ({b['pull_bytes_per_pulled_row']} B per pulled row, "
          f"{b['push_bytes_per_pushed_row']} B per pushed row)")
    m = out["ps_pull_mb_per_s"]
    print(f"PS pull MB/s: {m['over_pull_wait']} over pull wait, {m['over_wall']} over wall; "
          f"push {m['push_over_push_wait']} over push wait")
    print(f"requests/step: {out['requests_per_step']}")
    print(f"PS wait ms/step: { {k: v for k, v in out['ps_wait_ms_per_step'].items() if k != 'note'} }")
    print(f"rows/step: {out['rows_per_step']}")
    rp = out["shard_rows_per_core_s"]
    print(f"shard rows per core-second: pull {rp['pull']}, push {rp['push']} (serving thread "
          f"only: pull {rp['pull_serving_thread_only']}, push {rp['push_serving_thread_only']}; "
          f"shard CPU {rp['shard_cpu_s']} s)")
    o = out["bytes_per_row_overhead"]
    print(f"shard bytes per row: overhead {o['value']} (+ slab slack {o.get('slab_slack_bytes_per_row')}), "
          f"row and state {o.get('row_and_state_bytes_per_row')}")
    pin = out["a_over_resident_pinned"]
    if "ratio" in pin:
        print(f"A / resident, 1 shard pinned to its own core: {pin['ratio']} (paired "
              f"{pin['ratio_paired']}; losses identical {pin['losses_identical']})")
    else:
        print(f"A / resident pinned: {pin['skipped']}")
    for k, t in out["targets"].items():
        print(f"TARGET {k}: {t['value']} {'PASS' if t['pass'] else 'MISS'}")
    print(f"losses identical (A == all-resident): {out['losses_identical']}; "
          f"shard processes left: {out['shard_processes_left']}")
    if out["engine_sources_changed"]:
        print("WARNING: cosparse/ was edited during the run: its processes ran different engine "
              f"sources {out['machine']['engine_sources_sha1']}; rerun to compare them", flush=True)
    print(f"wall {out['wall_s']} s; loadavg start {out['machine']['loadavg']} end "
          f"{out['machine']['loadavg_end']}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.add_run_args(ap,
                        quick="8 tables x 100k rows, batch 1024, warm-up 3, 3 rounds x 4 steps: < 60 s",
                        tiny="smoke-test size: 2 tables x 10k rows, batch 128, warm-up 2, 3 rounds x 2 steps")
    ap.add_argument("--check-versions", action="store_true",
                    help="debug: check every row ps_direct trains against the PS's version (one "
                         "extra PEEK per table and step; a stale row stops the run, naming it)")
    ap.add_argument("--shards", type=int, help="PS shard processes (default 2)")
    ap.add_argument("--lookahead", type=int, help="batches planned (pulled) ahead (default 1)")
    ap.add_argument("--pinned", action=argparse.BooleanOptionalAction, default=None,
                    help="also run A with 1 shard pinned to one core and its trainer to another, "
                         "against all-resident on the trainer's core (a_over_resident_pinned; "
                         "default: on in the full run, off with --quick / --tiny)")
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--ps-dir", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def config_from_args(a: argparse.Namespace) -> PSBenchConfig:
    pinned = a.pinned if a.pinned is not None else not (a.quick or a.tiny)
    cfg = PSBenchConfig(seed=a.seed, threads=a.threads, check_versions=a.check_versions,
                        pinned=pinned)
    cfg = common.sized(cfg, a,
                       quick={"rows": 100_000, "batch": 1024, "warmup": 3, "steps": 4, "rounds": 3},
                       tiny={"tables": 2, "rows": 10_000, "batch": 128, "warmup": 2, "steps": 2, "rounds": 3},
                       overrides=("steps", "rounds", "warmup", "tables", "rows", "batch", "shards",
                                  "lookahead"))
    if cfg.warmup < 1 or cfg.rounds < 1 or cfg.steps < 1 or cfg.shards < 1 or cfg.lookahead < 1:
        raise SystemExit("--warmup, --rounds, --steps, --shards and --lookahead must be >= 1")
    return cfg


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.worker:
        serve_ps(a.worker, PSBenchConfig(**json.loads(a.config_json)), Path(a.data), Path(a.ps_dir))
        return 0
    out = run_bench(a)
    if a.json:
        common.write_json(a.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
