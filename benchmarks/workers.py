"""The worker-process protocol: each contender runs in a process of its own; ``Worker`` is the
parent's handle on one and ``serve`` the loop in the worker (one JSON line per command), with
the alternating ``rotation`` of rounds and the CPU-noise figure ``other_cores``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from benchmarks.measure import REPO, busy_s, cpu_s

# ------------------------------------------------------------------------ the worker protocol
Handler = Callable[[Any, dict[str, Any]], dict[str, Any]]


def serve(setup: Callable[[], tuple[Any, dict[str, Any]]], commands: dict[str, Handler]) -> None:
    """The worker's loop: build the contender, then answer one JSON line per command on stdin.

    ``setup()`` builds the contender (its data included) and returns it with the fields of the
    "ready" message. ``commands[op](contender, cmd)`` answers ``{"cmd": op, ...}``; the reply gets
    ``wall_s`` and ``cpu_s`` (this process's CPU time) of the call. ``quit`` closes the contender
    (its ``close()``, when it has one) and answers ``bye``; the contender is also closed when stdin
    ends and on SIGTERM. A failure is answered ``{"error": ...}``, its traceback on stderr (the
    parent's log of this worker). Replies go to the original stdout; fd 1 is pointed at stderr so
    that library prints cannot corrupt the protocol.
    """
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    # a SIGTERM from the parent must still run the `finally` below (e.g. stop child processes)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    def send(msg: dict[str, Any]) -> None:
        proto.write(json.dumps(msg) + "\n")
        proto.flush()

    def fail(e: BaseException) -> None:
        import traceback

        traceback.print_exc()
        send({"error": f"{type(e).__name__}: {e}"})

    c: Any = None
    try:
        try:
            c, ready = setup()
            send({"ready": True, **ready, "pid": os.getpid()})
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            fail(e)
            return
        for line in sys.stdin:
            cmd = json.loads(line)
            try:
                op = cmd["cmd"]
                if op == "quit":
                    _close(c)
                    c = None
                    send({"bye": True})
                    return
                if op not in commands:
                    raise ValueError(f"unknown command {op!r}")
                c0, w0 = cpu_s(), time.perf_counter()
                res = commands[op](c, cmd)
                res["wall_s"] = time.perf_counter() - w0
                res["cpu_s"] = cpu_s() - c0
                send(res)
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                fail(e)
    finally:
        _close(c)


def _close(c: Any) -> None:
    close = getattr(c, "close", None)
    if close is not None:
        close()


class Worker:
    """The parent's handle on one contender's process (``python -m module *args``), which runs
    ``serve``. Its stderr goes to a log file that is shown when it fails."""

    def __init__(self, name: str, module: str, args: list[str], env: dict[str, str],
                 python: str = sys.executable) -> None:
        self.name = name
        self.log = tempfile.NamedTemporaryFile(
            "w+", prefix=f"bench_{name}_", suffix=".log", delete=False
        )
        self.proc = subprocess.Popen(
            [python, "-m", module, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.log, text=True, bufsize=1, env=env, cwd=str(REPO),
        )
        self.ready: dict[str, Any] = {}

    def recv(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.name} exited (rc={self.proc.poll()}):\n{self.log_tail()}")
        msg = json.loads(line)
        if "error" in msg:
            raise RuntimeError(f"worker {self.name} failed: {msg['error']}\n{self.log_tail()}")
        return msg

    def call(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.recv()

    def call_busy(self, **cmd: Any) -> tuple[dict[str, Any], float]:
        """``call``, and the CPU seconds the whole machine was busy meanwhile."""
        b0 = busy_s()
        r = self.call(**cmd)
        return r, busy_s() - b0

    def log_tail(self, n: int = 4000) -> str:
        self.log.flush()
        try:
            return Path(self.log.name).read_text()[-n:]
        except OSError:
            return ""

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.call(cmd="quit")
                self.proc.wait(timeout=30)
        except Exception:  # noqa: BLE001 - best effort
            pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)


def worker_env(threads: int) -> dict[str, str]:
    """The workers' environment: OpenMP and numba limited to ``threads`` (0: their defaults)."""
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
        env["NUMBA_NUM_THREADS"] = str(threads)
    return env


def close_all(workers: dict[str, Worker]) -> None:
    for w in workers.values():
        w.close()


def wait_ready(workers: dict[str, Worker], describe: Callable[[dict[str, Any]], str],
               checksum: str | None = None) -> None:
    """Receive every worker's "ready" message (the workers set up concurrently, untimed) and check
    that they all hold the same data (``checksum``: the parent's)."""
    for n, w in workers.items():
        w.ready = w.recv()
        if checksum is not None and w.ready["checksum"] != checksum:
            raise RuntimeError(f"worker {n} loaded different data")
        print(f"  {n}: ready ({describe(w.ready)})", flush=True)
    sums = {n: w.ready["checksum"] for n, w in workers.items()}
    if len(set(sums.values())) != 1:
        raise RuntimeError(f"workers generated different data: {sums}")


def rotation(names: Iterable[str], r: int) -> list[str]:
    """Round ``r``'s order: the contenders with the start rotated by ``r``."""
    names = list(names)
    k = r % len(names)
    return names[k:] + names[:k]


def other_cores(busy: float, r: dict[str, Any], own_s: float = 0.0) -> float:
    """Cores other processes used during a call: the machine's busy CPU seconds (``call_busy``)
    minus the worker's own (``r["cpu_s"]``, and ``own_s``: e.g. its children's), over its wall time.
    Values near 1 mean another job held a core: a noise flag."""
    return max(0.0, busy - r["cpu_s"] - own_s) / max(r["wall_s"], 1e-9)
