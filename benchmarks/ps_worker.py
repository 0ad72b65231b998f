"""bench_ps' worker side: the workload config and goals, the PS shard processes' helpers (find,
pin), and the worker that trains one contender (the PS path or all rows resident) on command."""

from __future__ import annotations

import dataclasses
import os
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
