"""CPU contention: each workload alone, then beside k = 1, 2, 4 busy-loop processes (issue 18).

Workloads, each a whole ``Trainer`` in a worker process of its own (``--worker NAME``), built once
and trained ``steps`` more steps per timed call (DIN: 4x as many, its steps are quicker), with
its thread budget left at ``auto``:
- ``resident``, ``tiered``, ``arch_b``: the foundation workload (``bench_ab``'s config at its quick
  size: 8 tables x 100k rows x 64, batch 1024, 2 data workers); all rows resident; a 10% device
  tier over an unbounded host tier, 2 batches ahead; architecture B's preset over 2 embedded PS
  shards;
- ``din``: DIN on the Taobao sample with a device tier (the exactness test's workload,
  ``tests/test_din.py``), from ``../shared/data``.

Per round and per k (0 first, then 1, 2, 4): the benchmark starts k ``while True: pass`` processes,
runs every workload once (its order rotated), and stops them. The figures, per workload and k:

- ``u``: the cores the workload keeps busy alone: CPU seconds of its whole process tree (trainer,
  data workers, embedded shards) over its wall seconds, at k = 0;
- ``predicted``: the slowdown that the CPU share it loses predicts, ``max(1, (u + k) / N)`` on
  ``N`` cores: k busy loops and the workload's ``u`` cores of demand share the ``N`` cores fairly;
- ``slowdown``: wall seconds beside k loops over wall seconds alone (the same round's);
- ``slowdown_over_fair_share`` = slowdown / predicted, the median over rounds. Goal: <= 1.5.

Each call also records ``other_cores``: the cores that processes other than the workload and the
loops kept busy meanwhile (the machine's busy CPU from ``/proc/stat``, less both). The figures
hold for a host otherwise idle; ``alone_other_cores`` well above 0 flags a run that was not.
Before the rounds and before each alone call the benchmark waits until the host is quiet
(``settle``), since the workers go on working for a while after they report ready.

``--wait-policies`` also runs every workload alone with ``OMP_WAIT_POLICY=ACTIVE`` (a worker of
its own: libgomp reads it at start), after the rounds and one worker at a time (an idle worker
with spinning threads keeps about 0.4 of a core busy), and reports ``passive_idle_cost``:
passive's wall seconds over active's, minus 1, at k = 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks.common import (
    REPO,
    SHARED_DATA,
    Worker,
    busy_s,
    machine_info,
    proc_cpu_s,
    serve,
    tree_cpu_s,
    write_json,
)

WORKLOADS = ("resident", "tiered", "arch_b", "din")
STEPS_SCALE = {"din": 4}  # DIN's batches are 4x quicker: its calls train 4x the steps
KS = (0, 1, 2, 4)
GOAL = 1.5
TAOBAO = SHARED_DATA / "taobao-userbehavior" / "UserBehavior_head84k.csv"


# ------------------------------------------------------------------------------ the workloads
def foundation(name: str, batches: int, tiny: bool) -> dict[str, Any]:
    """``bench_ab``'s quick (or tiny) foundation config, as ``name`` places its rows."""
    from benchmarks.bench_ab import workload
    from cosparse.config import switch_preset

    raw, _, _ = workload(quick=True, tiny=tiny)
    raw["train"].pop("threads", None)  # the budget's auto
    raw["data"]["synthetic"]["num_batches"] = batches
    vocab = raw["data"]["synthetic"]["vocab_size"]
    if name == "arch_b":
        return switch_preset(raw, "arch-b")
    raw.pop("store")
    if name == "tiered":
        raw["store"] = {"device": {"rows": vocab // 10, "policy": "hotness"},
                        "host": {"policy": "lfu"}}
    raw["supply"] = {"path": "resident", "lookahead": 2}
    return raw


def din() -> dict[str, Any]:
    """DIN on the Taobao sample (configs/taobao_din.yaml: batch 256, 50 events of history), every
    table's device tier at 16,384 rows over an unbounded host tier."""
    from cosparse.config import read_config_mapping

    raw = read_config_mapping(REPO / "configs" / "taobao_din.yaml")
    raw["data"]["path"] = str(TAOBAO)
    raw["train"].pop("threads", None)
    raw["store"] = {"device": {"rows": 16384, "policy": "hotness"}, "host": {"policy": "lfu"}}
    raw["supply"] = {"path": "resident", "lookahead": 2}
    return raw


class Job:
    """One workload's trainer, trained on demand."""

    def __init__(self, name: str, batches: int, tiny: bool = False) -> None:
        from cosparse.config import config_from_mapping
        from cosparse.train.trainer import Trainer

        raw = din() if name == "din" else foundation(name, batches, tiny)
        raw["train"].update(steps=10**9, epochs=10**6, log_every=10**9, progress=False, eval_every=0,
                            tensorboard_dir=None, metrics_json=None, timing_warmup_steps=0)
        raw["train"]["checkpoint"] = {"every": 0}
        self.trainer = Trainer(config_from_mapping(raw), log=lambda m: None)
        self.batch = raw["data"]["batch_size"]

    def run(self, steps: int) -> dict[str, Any]:
        t = self.trainer
        c0, s0 = tree_cpu_s(os.getpid()), t.state.step
        final = t.run(steps=s0 + steps, evaluate=False)
        done = t.state.step - s0
        return {"steps": done, "samples": done * self.batch, "tree_cpu_s": tree_cpu_s(os.getpid()) - c0,
                "sync": final.get("sync"), "cpu": final.get("cpu")}

    def close(self) -> None:
        self.trainer.close()


def worker_main(name: str, batches: int, warmup: int, tiny: bool) -> None:
    def setup() -> tuple[Job, dict[str, Any]]:
        job = Job(name, batches, tiny)
        job.run(warmup)
        return job, {"name": name}

    serve(setup, {"run": lambda job, cmd: job.run(cmd["steps"])})


# ------------------------------------------------------------------------------ the busy loops
class BusyLoops:
    """k processes that spin on a core each until stopped."""

    def __init__(self, k: int) -> None:
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                       stdin=subprocess.DEVNULL) for _ in range(k)]
        time.sleep(0.2 if k else 0.0)  # (let the scheduler see them)

    def close(self) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()

    def __enter__(self) -> BusyLoops:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------------------ the parent
def settle(quiet_cores: float = 0.15, window_s: float = 1.0, limit_s: float = 90.0) -> float:
    """Wait until the machine is quiet: its busy CPU over ``window_s`` below ``quiet_cores``.

    The workers go on working after they report ready (data workers filling their queues, the
    prefetch thread reading up to its gate); an alone call timed meanwhile is slowed by them and
    every k's slowdown looks small. Returns the last window's busy cores; after ``limit_s`` it
    gives up (a host busy with other jobs) and says so."""
    t0 = time.perf_counter()
    while True:
        b0 = busy_s()
        time.sleep(window_s)
        cores = (busy_s() - b0) / window_s
        if cores < quiet_cores:
            return cores
        if time.perf_counter() - t0 > limit_s:
            print(f"  the host did not go quiet in {limit_s:.0f} s ({cores:.2f} cores busy): "
                  "the alone figures are not from an idle host", flush=True)
            return cores
def figures(calls: list[dict[str, Any]], cores: int, ks: tuple[int, ...]) -> dict[str, Any]:
    """Per k: the median slowdown, prediction and their ratio over the rounds (each round's k
    against the same round's k = 0)."""
    out: dict[str, Any] = {}
    by_round: dict[int, dict[int, dict[str, Any]]] = {}
    for c in calls:
        by_round.setdefault(c["round"], {})[c["k"]] = c
    alone = [r[0] for r in by_round.values() if 0 in r]
    u = statistics.median(c["tree_cpu_s"] / c["wall_s"] for c in alone)
    out["u_cores"] = round(u, 3)
    out["alone_wall_s"] = round(statistics.median(c["wall_s"] for c in alone), 3)
    out["alone_samples_per_s"] = round(statistics.median(c["samples"] / c["wall_s"] for c in alone))
    out["waits_per_step"] = statistics.median(c["sync"]["waits_per_step"] for c in alone)
    # a noise flag: cores that other processes kept busy while the workload ran alone
    out["alone_other_cores"] = statistics.median(c["other_cores"] for c in alone)
    per_k = {}
    for k in ks[1:]:
        pairs = [(r[k], r[0]) for r in by_round.values() if k in r and 0 in r]
        if not pairs:
            continue
        predicted = max(1.0, (u + k) / cores)
        slow = [c["wall_s"] / a["wall_s"] for c, a in pairs]
        per_k[str(k)] = {"slowdown": round(statistics.median(slow), 3),
                         "predicted": round(predicted, 3),
                         "slowdown_over_fair_share": round(statistics.median(slow) / predicted, 3)}
    out["per_k"] = per_k
    return out


def active_calls(a: argparse.Namespace, names: list[str], args: list[str], env: dict[str, str],
                 quiet_s: float) -> dict[str, list[dict[str, Any]]]:
    """Each workload alone, ``a.rounds`` calls, in a worker whose OpenMP threads spin
    (``OMP_WAIT_POLICY=ACTIVE``). One at a time, after the rounds: an idle worker of that kind
    keeps its threads spinning, and would take the cores from whatever else runs."""
    out: dict[str, list[dict[str, Any]]] = {}
    for n in names:
        w = Worker(f"{n}@active", "benchmarks.bench_contention", ["--worker", n, *args], env)
        try:
            w.recv()
            out[f"{n}@active"] = []
            for r in range(a.rounds):
                settle(limit_s=min(quiet_s, 20.0), quiet_cores=1.2)  # (its own threads spin)
                res = w.call(cmd="run", steps=a.steps * STEPS_SCALE.get(n, 1))
                res.update(round=r, k=0)
                out[f"{n}@active"].append(res)
                print(f"  round {r} k=0 {n}@active: {res['wall_s']:.2f} s", flush=True)
        finally:
            w.close()
    return out


def run(a: argparse.Namespace, ks: tuple[int, ...]) -> dict[str, Any]:
    cores = len(os.sched_getaffinity(0))
    names = [n for n in WORKLOADS if n in a.workloads.split(",")]
    if "din" in names and not TAOBAO.exists():
        print(f"din: skipped, {TAOBAO} is not present", flush=True)
        names.remove("din")
    env = {**os.environ}
    env.pop("OMP_WAIT_POLICY", None)  # cosparse's own default (passive)
    args = ["--batches", str(a.batches), "--warmup", str(a.warmup), *(["--tiny"] if a.tiny else [])]
    workers = {n: Worker(n, "benchmarks.bench_contention", ["--worker", n, *args], env)
               for n in names}
    calls: dict[str, list[dict[str, Any]]] = {n: [] for n in workers}
    loop_pids: list[int] = []
    t0 = time.perf_counter()
    try:
        for n, w in workers.items():  # (they set up concurrently, untimed)
            w.ready = w.recv()
            print(f"  {n}: ready", flush=True)
        quiet_s = 3.0 if a.tiny else 90.0  # (the smoke test runs on loaded CI hosts)
        print(f"  settled: {settle(limit_s=quiet_s):.2f} cores busy", flush=True)
        for r in range(a.rounds):
            for k in ks:
                with BusyLoops(k) as loops:
                    loop_pids += [p.pid for p in loops.procs]
                    order = names[r % len(names):] + names[:r % len(names)]
                    for n in order:
                        if k == 0:
                            settle(limit_s=min(quiet_s, 20.0))
                        l0 = sum(proc_cpu_s(p.pid) for p in loops.procs)
                        steps = a.steps * STEPS_SCALE.get(n.split("@")[0], 1)
                        res, busy = workers[n].call_busy(cmd="run", steps=steps)
                        spun = sum(proc_cpu_s(p.pid) for p in loops.procs) - l0
                        # cores that processes other than the workload and the loops kept busy
                        other = max(0.0, busy - res["tree_cpu_s"] - spun) / res["wall_s"]
                        res.update(round=r, k=k, other_cores=round(other, 3))
                        calls[n].append(res)
                        print(f"  round {r} k={k} {n}: {res['wall_s']:.2f} s, "
                              f"{res['tree_cpu_s'] / res['wall_s']:.2f} cores, "
                              f"{res['sync']['waits_per_step']:.2f} waits/step, "
                              f"other processes {other:.2f} cores", flush=True)
    finally:
        for w in workers.values():
            w.close()
    out: dict[str, Any] = {"workloads": {n: figures(calls[n], cores, ks) for n in names}}
    if a.wait_policies:
        active = active_calls(a, names, args, {**env, "OMP_WAIT_POLICY": "ACTIVE"}, quiet_s)
        calls.update(active)
        out["passive_idle_cost"] = {
            n: round(statistics.median(c["wall_s"] for c in calls[n] if c["k"] == 0)
                     / statistics.median(c["wall_s"] for c in active[f"{n}@active"]) - 1, 3)
            for n in names}
    worst = max(f["slowdown_over_fair_share"] for w in out["workloads"].values()
                for f in w["per_k"].values())
    out["worst_slowdown_over_fair_share"] = worst
    out["targets"] = {f"slowdown_over_fair_share<={GOAL}": worst <= GOAL}
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    out["calls"] = calls
    out["busy_loop_pids"] = loop_pids
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="one round, fewer steps (<= 3 min)")
    p.add_argument("--tiny", action="store_true",
                   help="the smoke test's: resident only, k = 0 and 1, 3 steps")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--steps", type=int, default=None, help="timed steps per call")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps at setup")
    p.add_argument("--batches", type=int, default=5000, help="synthetic batches per epoch")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--wait-policies", action="store_true",
                   help="also run each workload alone with OMP_WAIT_POLICY=ACTIVE")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.tiny:
        a.quick, a.workloads, a.steps, a.warmup, a.batches = True, "resident", 3, 1, 20
    a.rounds = a.rounds or (1 if a.quick else 3)
    a.steps = a.steps or (30 if a.quick else 60)
    a.warmup = a.warmup if a.warmup is not None else (6 if a.quick else 12)
    if a.worker:
        worker_main(a.worker, a.batches, a.warmup, a.tiny)
        return 0
    ks = KS[:2] if a.tiny else KS
    out = {"benchmark": "bench_contention",
           "mode": "tiny" if a.tiny else "quick" if a.quick else "full",
           "machine": machine_info(), "rounds": a.rounds, "steps": a.steps, "ks": list(ks),
           **run(a, ks)}
    print(json.dumps({k: v for k, v in out.items() if k != "calls"}, indent=1))
    if a.json:
        write_json(a.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
