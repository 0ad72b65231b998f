#!/usr/bin/env python3
"""Architecture A (ps-direct) vs the all-resident engine: DLRM training with every embedding row on
2 local parameter-server shards, against the same model with all rows resident in the trainer.

Workload: the one of bench_inmemory.py (8 tables x 1M x 64 fp32, Zipf 1.05 raw int64 IDs, bags
1..20, batch 4096, DLRM 13-512-256-64 / 512-256-1, row-wise Adagrad on embeddings, Adagrad on
dense). ``--quick`` / ``--tiny`` shrink it (see ``--help`` and benchmarks/README.md).

Contenders, each in its OWN worker process (bench_inmemory's Worker protocol), ALTERNATING rounds:
  ps_direct  EmbeddingCollection(tables, ps_client=client, lookahead=k): every table on the PS.
             The worker starts ``EmbeddedShards(shards, tables)``: real ``cosparse ps serve``
             processes, children of the worker, on the SAME cores as everything else. Each batch
             pulls its unique rows when it is planned (on the prefetch thread, up to k batches
             ahead), rows that a batch in flight will update are pulled right before the batch
             trains, and ``ec.apply_gradients()`` pushes the row gradients; the shards run the
             optimizer.
  resident   EmbeddingCollection(tables): all rows in the trainer process (the baseline).
Both train like the trainer: one long-lived ``Prefetcher(ec.staged(source, 0), identity,
lookahead)``, forward, BCE, backward, dense Adagrad step, ``ec.apply_gradients()``. The source is
*gated* (as in bench_tiers): during a round the prefetch thread may read at most ``lookahead``
batches past the round, so it does no work while the other contender is timed and every timed
round does steady-state work. Both contenders see the same batches in the same order from the same
seeds, so by the exactness invariant their losses must be identical (``losses_identical``).
``--check-versions`` also checks every row ps_direct trains against the PS's version (a debug
PEEK per table and step: a stale row stops the run, naming it). Every process takes the hash
of the engine sources at its start, once ready and at the end: ``engine_sources_changed``
says that cosparse/ was edited during the run, so its processes may have run different code.

Figures come from the client's own counters (``PSClient.counters``: every byte on the sockets,
headers included). The worker wraps the client's request call (in its own process only) to split
the waits and requests by operation and by thread (prefetch thread vs trainer thread).
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

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from bench_inmemory import (  # noqa: E402 - benchmarks/ is not a package
    BOTTOM,
    NUM_DENSE,
    TOP,
    BenchConfig,
    Worker,
    _busy_s,
    _median,
    _pct,
    cpu_s,
    data_checksum,
    machine_info,
    make_batches,
    peak_rss_mb,
    rss_mb,
    set_threads,
)
from bench_tiers import load_batches, save_batches, sparse_batches, spread  # noqa: E402

CONTENDERS = ("ps_direct", "resident")
_HZ = os.sysconf("SC_CLK_TCK")
MB = 1e6  # MB/s figures are 10^6 bytes per second


# ------------------------------------------------------------------------------------- config
@dataclasses.dataclass
class PSBenchConfig:
    tables: int = 8
    rows: int = 1_000_000
    dim: int = 64
    batch: int = 4096
    alpha: float = 1.05
    max_bag: int = 20
    lr: float = 0.01
    eps: float = 1e-8
    seed: int = 1234
    warmup: int = 6  # untimed trained batches before round 0 (JIT, first-touch, vocab growth)
    steps: int = 8
    rounds: int = 7
    lookahead: int = 1
    shards: int = 2
    threads: int = 0
    check_versions: bool = False  # debug: every row checked against the PS's version (a PEEK)
    timeout_s: float = 120.0  # PS request timeout
    heartbeat_s: float = 1.0

    @property
    def n_train(self) -> int:
        return self.warmup + self.rounds * self.steps

    @property
    def n_batches(self) -> int:  # the gate lets the last round plan `lookahead` batches past it
        return self.n_train + self.lookahead

    def round_start(self, r: int) -> int:
        return self.warmup + r * self.steps

    def bench_config(self) -> BenchConfig:
        """bench_inmemory's config that generates the same batches (same generator stream)."""
        return BenchConfig(tables=self.tables, rows=self.rows, dim=self.dim, batch=self.batch,
                           alpha=self.alpha, max_bag=self.max_bag, seed=self.seed,
                           warmup=self.n_batches, steps=0, rounds=0, emb_steps=0, breakdown_steps=0)


def table_configs(cfg: PSBenchConfig) -> list[Any]:
    from cosparse.config import OptimizerConfig, TableConfig

    return [
        TableConfig(name=f"t{i}", dim=cfg.dim, features=[f"f{i}"], pooling="sum",
                    optimizer=OptimizerConfig(kind="rowwise_adagrad", lr=cfg.lr, eps=cfg.eps),
                    num_embeddings=cfg.rows)
        for i in range(cfg.tables)
    ]


def engine_fingerprint() -> str:
    """Hash of every engine source file (others edit cosparse/ concurrently). Each worker takes it
    when it starts, once its contender is ready (its modules imported, its shard processes up)
    and at the end: a file changed in between would make the processes of one run (the shards
    included) run different code, and their losses differ for that reason alone."""
    import hashlib

    root = HERE.parent / "cosparse"
    h = hashlib.sha1()
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


# ------------------------------------------------------------------------- process helpers
def proc_cpu_s(pid: int) -> float:
    """utime + stime of one process (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _HZ
    except (OSError, IndexError, ValueError):
        return 0.0


def proc_hwm_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


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

    def __init__(self, name: str, cfg: PSBenchConfig, raw: list[dict[str, np.ndarray]],
                 ps_dir: Path) -> None:
        import numba
        import torch

        from cosparse.nn.embedding import EmbeddingCollection
        from cosparse.nn.models import DLRM
        from cosparse.train.prefetch import Prefetcher

        if cfg.threads:
            numba.set_num_threads(min(cfg.threads, numba.config.NUMBA_NUM_THREADS))
        self.name, self.cfg = name, cfg
        self.shards: Any = None
        self.client: Any = None
        self.probe: ClientProbe | None = None
        self.pf: Any = None
        tables = table_configs(cfg)
        if name == "ps_direct":
            from cosparse.ps import EmbeddedShards

            self.shards = EmbeddedShards(cfg.shards, tables=tables, data_dir=ps_dir)
            self.client = self.shards.client(timeout_s=cfg.timeout_s, heartbeat_s=cfg.heartbeat_s)
            self.probe = ClientProbe(self.client)
            self.ec = EmbeddingCollection(tables, device="cpu", ps_client=self.client,
                                          lookahead=cfg.lookahead)
            for t in self.ec.tables.values():
                t.check_versions = cfg.check_versions
        elif name == "resident":
            self.ec = EmbeddingCollection(tables, device="cpu")
        else:
            raise ValueError(f"unknown contender {name!r}")
        torch.manual_seed(cfg.seed)
        self.model = DLRM(self.ec, NUM_DENSE, bottom=[*BOTTOM, cfg.dim], top=list(TOP))
        self.model.train()
        self.opt = torch.optim.Adagrad(self.model.parameters(), lr=cfg.lr)
        self.batches = sparse_batches(cfg, raw)  # type: ignore[arg-type] - uses cfg.tables only
        self.cond = threading.Condition()
        self.allowed = -1  # the source may yield batches with index <= allowed
        self.stopped = False
        self.pf = Prefetcher(self.ec.staged(self._source(), 0), lambda p: p, cfg.lookahead)
        self.it = iter(self.pf)
        self.trained = 0

    @property
    def shard_pids(self) -> list[int]:
        return list(self.shards.pids) if self.shards is not None else []

    def _source(self):
        for i, sb in enumerate(self.batches):
            with self.cond:
                while self.allowed < i and not self.stopped:
                    self.cond.wait(0.1)
                if self.stopped:
                    return
            yield sb

    def _rows(self) -> dict[str, int]:
        tabs = self.ec.tables.values()
        return {"pulled": sum(int(getattr(t, "pulled_rows", 0)) for t in tabs),
                "deferred": sum(int(getattr(t, "deferred_rows", 0)) for t in tabs)}

    def train(self, start: int, n: int) -> dict[str, Any]:
        import torch.nn.functional as F

        if start != self.trained:
            raise RuntimeError(f"{self.name}: asked to train from batch {start}, next is {self.trained}")
        with self.cond:  # plan at most `lookahead` batches past this round, as in steady state
            self.allowed = start + n + self.cfg.lookahead - 1
            self.cond.notify_all()
        c0 = self.probe.snapshot() if self.probe else {}
        r0 = self._rows()
        sh0 = sum(proc_cpu_s(p) for p in self.shard_pids)
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
        self.trained += n
        out: dict[str, Any] = {
            "step_s": times, "losses": losses, "round_wall_s": wall, "unique_rows": uniques,
            "step_parts_ms": {k: 1e3 * v / n for k, v in parts.items()},
            "wait_ms": self.pf.wait_ms - wait0,
            "stage_ms": {k: v - stage0.get(k, 0.0) for k, v in self.ec.stage_ms.items()},
            "shard_cpu_s": sum(proc_cpu_s(p) for p in self.shard_pids) - sh0,
            "rows": _delta(r0, self._rows()),
        }
        if self.probe:
            out["client"] = _delta(c0, self.probe.snapshot())
        return out

    def stats(self) -> dict[str, Any]:
        import numba
        import torch

        info: dict[str, Any] = {"torch_threads": torch.get_num_threads(),
                                "numba_threads": numba.get_num_threads(),
                                "lookahead": self.cfg.lookahead}
        if self.shards is not None:
            info["shards"] = self.cfg.shards
            info["shard_pids"] = self.shard_pids
            info["shard_peak_rss_mb"] = [round(proc_hwm_mb(p)) for p in self.shard_pids]
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
            with self.cond:
                self.stopped = True
                self.cond.notify_all()
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


def serve(name: str, cfg: PSBenchConfig, data: Path, ps_dir: Path) -> None:
    """Worker loop (bench_inmemory's protocol: JSON lines on the original stdout)."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    # a SIGTERM from the parent must still run the `finally` below (stop the shards)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    def send(msg: dict[str, Any]) -> None:
        proto.write(json.dumps(msg) + "\n")
        proto.flush()

    c: PSContender | None = None
    try:
        try:
            set_threads(cfg.threads)
            t0 = time.perf_counter()
            fingerprint = engine_fingerprint()
            raw = load_batches(data)
            checksum = data_checksum(raw)
            rss_data = rss_mb()
            c = PSContender(name, cfg, raw, ps_dir)
            del raw
            send({"ready": True, "checksum": checksum, "setup_s": round(time.perf_counter() - t0, 2),
                  "rss_after_data_mb": round(rss_data), "pid": os.getpid(),
                  "shard_pids": c.shard_pids, "engine": [fingerprint, engine_fingerprint()]})
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            import traceback

            traceback.print_exc()
            send({"error": f"{type(e).__name__}: {e}"})
            return
        for line in sys.stdin:
            cmd = json.loads(line)
            try:
                op = cmd["cmd"]
                if op == "quit":
                    c.close()
                    c = None
                    send({"bye": True})
                    return
                c0, w0 = cpu_s(), time.perf_counter()
                if op == "train":
                    res = c.train(cmd["start"], cmd["n"])
                elif op == "stats":
                    res = {"peak_rss_mb": round(peak_rss_mb()), "rss_mb": round(rss_mb()),
                           "info": c.stats(), "engine": engine_fingerprint()}
                else:
                    raise ValueError(f"unknown command {op!r}")
                res["wall_s"] = time.perf_counter() - w0
                res["cpu_s"] = cpu_s() - c0
                send(res)
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                import traceback

                traceback.print_exc()
                send({"error": f"{type(e).__name__}: {e}"})
    finally:
        if c is not None:
            c.close()


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
    env = dict(os.environ)
    if cfg.threads:
        env["OMP_NUM_THREADS"] = str(cfg.threads)
        env["NUMBA_NUM_THREADS"] = str(cfg.threads)
    cfg_json = json.dumps(dataclasses.asdict(cfg))
    machine = machine_info()
    print(f"config: {cfg_json}\n  trained batches {cfg.n_train} (warm-up {cfg.warmup}), "
          f"{cfg.shards} PS shards\nmachine: {json.dumps(machine)}", flush=True)
    t_start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="bench_ps_"))
    ps_dir = tmp / "ps"
    workers: dict[str, Worker] = {}
    left: list[int] = []
    try:
        t0 = time.perf_counter()
        raw = make_batches(cfg.bench_config())
        data = tmp / "batches.npz"
        save_batches(raw, data)
        checksum = data_checksum(raw)
        ids_per_batch = float(np.mean([b["values"].shape[0] for b in raw]))
        del raw
        print(f"data: {cfg.n_batches} batches, {ids_per_batch:,.0f} IDs/batch, "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        for n in CONTENDERS:
            argv = [sys.executable, str(HERE / "bench_ps.py"), "--worker", n, "--config-json",
                    cfg_json, "--data", str(data), "--ps-dir", str(ps_dir)]
            workers[n] = Worker(n, argv, env)
        for n, w in workers.items():
            w.ready = w.recv()
            if w.ready["checksum"] != checksum:
                raise RuntimeError(f"worker {n} loaded different data")
            print(f"  {n}: ready (setup {w.ready['setup_s']} s, pid {w.ready['pid']}"
                  + (f", shard pids {w.ready['shard_pids']}" if w.ready["shard_pids"] else "") + ")",
                  flush=True)

        machine["engine_sources_sha1"] = {n: list(w.ready["engine"]) for n, w in workers.items()}
        if _sources_changed(machine):
            print(f"WARNING: the workers run different engine sources "
                  f"{machine['engine_sources_sha1']} (cosparse/ edited during start-up)", flush=True)
        res: dict[str, dict[str, Any]] = {n: defaultdict(list) for n in CONTENDERS}
        losses: dict[str, dict[int, float]] = {n: {} for n in CONTENDERS}

        def call(n: str, start: int, steps: int, timed: bool) -> None:
            b0 = _busy_s()
            r = workers[n].call(cmd="train", start=start, n=steps)
            busy = _busy_s() - b0
            losses[n].update({start + k: v for k, v in enumerate(r["losses"])})
            if not timed:
                return
            d = res[n]
            d["sps"].append(steps * cfg.batch / sum(r["step_s"]))
            d["step_s"].extend(r["step_s"])
            d["round_wall_s"].append(r["round_wall_s"])
            d["shard_cores"].append(r["shard_cpu_s"] / r["wall_s"])
            d["worker_cores"].append(r["cpu_s"] / r["wall_s"])
            d["other_cpu"].append(max(0.0, busy - r["cpu_s"] - r["shard_cpu_s"]) / r["wall_s"])
            d["wait_ms"].append(r["wait_ms"] / steps)
            d["stage_ms"].append({k: v / steps for k, v in r["stage_ms"].items()})
            d["step_parts_ms"].append(r["step_parts_ms"])
            d["unique_rows"].extend(r["unique_rows"])
            d["rows"].append(r["rows"])
            if "client" in r:
                d["client"].append(r["client"])

        for n in CONTENDERS:  # warm-up: JIT in workers and shards, allocator, vocabulary growth
            call(n, 0, cfg.warmup, timed=False)
        for r in range(cfg.rounds):
            order = CONTENDERS[r % 2:] + CONTENDERS[: r % 2]
            for n in order:
                call(n, cfg.round_start(r), cfg.steps, timed=True)
            line = "  ".join(f"{n} {res[n]['sps'][-1]:,.0f}" for n in CONTENDERS)
            print(f"round {r + 1}/{cfg.rounds} samples/s: {line}  (shards used "
                  f"{res['ps_direct']['shard_cores'][-1]:.2f} cores)", flush=True)
        stats = {n: w.call(cmd="stats") for n, w in workers.items()}
        for n in CONTENDERS:  # start, ready (shards up), end
            machine["engine_sources_sha1"][n].append(stats[n]["engine"])
    finally:
        for w in workers.values():
            w.close()
        left = stop_leftovers(ps_dir)
        shutil.rmtree(tmp, ignore_errors=True)
    machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    return assemble(cfg, res, losses, stats, machine, ids_per_batch, left, t_start)


def _sources_changed(machine: dict[str, Any]) -> bool:
    """Whether any process of the run saw other engine sources than the others, at any point."""
    return len({h for hs in machine["engine_sources_sha1"].values() for h in hs}) > 1


def assemble(cfg: PSBenchConfig, res: dict[str, Any], losses: dict[str, dict[int, float]],
             stats: dict[str, Any], machine: dict[str, Any], ids_per_batch: float,
             left: list[int], t_start: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["samples_per_s"] = {n: spread(res[n]["sps"]) for n in CONTENDERS}
    med = {n: out["samples_per_s"][n]["median"] for n in CONTENDERS}
    out["ratio"] = round(med["ps_direct"] / med["resident"], 3)
    out["ratio_paired"] = round(_median([x / y for x, y in zip(res["ps_direct"]["sps"],
                                                               res["resident"]["sps"],
                                                               strict=True)]), 3)
    d = res["ps_direct"]
    steps = cfg.rounds * cfg.steps
    tot = {k: sum(c[k] for c in d["client"]) for k in ("bytes_pull", "bytes_push", "bytes_other",
                                                       "requests", "wait_s")}
    by_wait: dict[str, float] = defaultdict(float)
    by_req: dict[str, int] = defaultdict(int)
    for c in d["client"]:
        for k, v in c["wait_s_by"].items():
            by_wait[k] += v
        for k, v in c["requests_by"].items():
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
    out["shard_cpu_cores"] = {"median": round(_median(d["shard_cores"]), 2),
                              "rounds": [round(x, 2) for x in d["shard_cores"]]}
    common = sorted(set(losses["ps_direct"]) & set(losses["resident"]))
    diffs = [abs(losses["ps_direct"][i] - losses["resident"][i]) for i in common]
    out["losses_identical"] = bool(common) and max(diffs) == 0.0
    out["engine_sources_changed"] = _sources_changed(machine)
    out["loss_max_abs_diff"] = max(diffs) if diffs else None
    left_now = [p for p in left if Path(f"/proc/{p}").exists()]
    out["shard_processes_left"] = len(left_now)
    out["shard_processes_killed_by_parent"] = len(left)
    per: dict[str, Any] = {}
    for n in CONTENDERS:
        r = res[n]
        stage_keys = sorted({k for s in r["stage_ms"] for k in s})
        part_keys = list(r["step_parts_ms"][0]) if r["step_parts_ms"] else []
        per[n] = {
            "samples_per_s": out["samples_per_s"][n],
            "step_ms_p50": round(1e3 * _median(r["step_s"]), 1),
            "step_ms_p10_p90": [round(1e3 * _pct(r["step_s"], q), 1) for q in (0.1, 0.9)],
            "trainer_wait_ms_per_step": [round(x, 1) for x in r["wait_ms"]],
            "stage_ms_per_step": {k: round(_median([s.get(k, 0.0) for s in r["stage_ms"]]), 2)
                                  for k in stage_keys},
            "step_parts_ms": {k: round(_median([s[k] for s in r["step_parts_ms"]]), 1)
                              for k in part_keys},
            "worker_cpu_cores": [round(x, 2) for x in r["worker_cores"]],
            "other_cpu_cores": [round(x, 2) for x in r["other_cpu"]],
            "loss_last": losses[n][max(losses[n])] if losses[n] else None,
            "peak_rss_mb": stats[n]["peak_rss_mb"],
            "info": stats[n]["info"],
        }
    per["ps_direct"]["shard_cpu_cores"] = out["shard_cpu_cores"]["rounds"]
    out["contenders"] = per
    out["config"] = {**dataclasses.asdict(cfg), "ids_per_batch": round(ids_per_batch),
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
        sh = _median(p["shard_cpu_cores"]) if "shard_cpu_cores" in p else 0.0
        rng = f"{s['min']:,}-{s['max']:,}"
        print(f"{n:<12}{s['median']:>11,}{rng:>17}{p['step_ms_p50']:>13}"
              f"{_median(p['worker_cpu_cores']):>14.2f}{sh:>13.2f}{max(p['other_cpu_cores']):>11}")
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
    print(f"losses identical (A == all-resident): {out['losses_identical']}; "
          f"shard processes left: {out['shard_processes_left']}")
    if out["engine_sources_changed"]:
        print("WARNING: cosparse/ was edited during the run: its processes ran different engine "
              f"sources {out['machine']['engine_sources_sha1']}; rerun to compare them", flush=True)
    print(f"wall {out['wall_s']} s; loadavg start {out['machine']['loadavg']} end "
          f"{out['machine']['loadavg_end']}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="8 tables x 100k rows, batch 1024, warm-up 3, 3 rounds x 4 steps: < 60 s")
    ap.add_argument("--tiny", action="store_true",
                    help="smoke-test size: 2 tables x 10k rows, batch 128, warm-up 2, 3 rounds x 2 steps")
    ap.add_argument("--steps", type=int, help="timed train steps per contender per round")
    ap.add_argument("--rounds", type=int, help="alternating timed rounds")
    ap.add_argument("--warmup", type=int, help="untimed trained batches before round 0")
    ap.add_argument("--threads", type=int, default=0, help="torch / numba threads (0: default)")
    ap.add_argument("--check-versions", action="store_true",
                    help="debug: check every row ps_direct trains against the PS's version (one "
                         "extra PEEK per table and step; a stale row stops the run, naming it)")
    ap.add_argument("--shards", type=int, help="PS shard processes (default 2)")
    ap.add_argument("--lookahead", type=int, help="batches planned (pulled) ahead (default 1)")
    ap.add_argument("--tables", type=int)
    ap.add_argument("--rows", type=int)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--config-json", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--ps-dir", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def config_from_args(a: argparse.Namespace) -> PSBenchConfig:
    cfg = PSBenchConfig(seed=a.seed, threads=a.threads, check_versions=a.check_versions)
    if a.quick:
        cfg = dataclasses.replace(cfg, rows=100_000, batch=1024, warmup=3, steps=4, rounds=3)
    if a.tiny:
        cfg = dataclasses.replace(cfg, tables=2, rows=10_000, batch=128, warmup=2, steps=2, rounds=3)
    over = {k: getattr(a, k) for k in ("steps", "rounds", "warmup", "tables", "rows", "batch",
                                         "shards", "lookahead")}
    cfg = dataclasses.replace(cfg, **{k: v for k, v in over.items() if v is not None})
    if cfg.warmup < 1 or cfg.rounds < 1 or cfg.steps < 1 or cfg.shards < 1 or cfg.lookahead < 1:
        raise SystemExit("--warmup, --rounds, --steps, --shards and --lookahead must be >= 1")
    return cfg


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.worker:
        serve(a.worker, PSBenchConfig(**json.loads(a.config_json)), Path(a.data), Path(a.ps_dir))
        return 0
    out = run_bench(a)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
