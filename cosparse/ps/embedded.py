"""EmbeddedShards: local ``cosparse ps serve`` subprocesses for the embedded default.

Spawns ``num_shards`` real server processes on free loopback ports (each binds port 0 and writes
its endpoint to a ready file), waits until every one answers PING, registers the tables, and
stops them (SIGTERM, then SIGKILL) on ``close()``, on context exit, at interpreter exit, and when
the parent dies, however it dies (``cosparse.lifeline``: the server's parent-pid watch thread, plus
``PR_SET_PDEATHSIG`` = SIGKILL when the main thread starts them).
``check()`` is the process watch: it raises ``PSUnavailable`` naming the shard and endpoint of an
embedded process that has exited.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import time
import weakref
from pathlib import Path

from cosparse.config import TableConfig
from cosparse.lifeline import pdeathsig
from cosparse.link import LinkShaper
from cosparse.ps.client import PSClient
from cosparse.ps.errors import PSUnavailable
from cosparse.ps.namespaces import DEFAULT_NAMESPACE

_LIVE: weakref.WeakSet[EmbeddedShards] = weakref.WeakSet()


def _close_all() -> None:
    for shards in list(_LIVE):
        shards.close()


atexit.register(_close_all)


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (state T: SIGSTOP, or t: stopped by a tracer)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"T", b"t")
    except (OSError, IndexError):
        return False


# Why shards outlived a dead trainer (issue 11, defect 5), found by experiment on Linux 2-core:
# - PR_SET_PDEATHSIG was SIGTERM. It fires when the *thread* that forked the child exits, not the
#   process: shards started from a thread that ends are signalled while the trainer lives
#   (verified: both exit 1.5 s after such a thread ends). And SIGTERM only asks: the shard's
#   handler sets a flag its request loop reads, then the interpreter shuts down, which took
#   1.3-6 s on a loaded machine (a hung trainer of defect 1 killed with SIGTERM: shards gone
#   after 6 s, the fork server after 7 s).
# - The parent-pid watch ran only after 200 ms without a request: a shard kept busy never
#   checked (verified: with PDEATHSIG off, a shard pinged every 50 ms was still running 10 s
#   after its parent's SIGKILL, and exited 1.5 s after the pings stopped). Requests from the
#   dead trainer's data workers, which also checked their parent only when idle, do that.
# Now: PDEATHSIG is SIGKILL and set only from the main thread, and the shard watches its parent
# on a thread of its own every 0.1 s whatever its request loop does (``lifeline``).


class EmbeddedShards:
    """``num_shards`` local shard processes with data under ``data_dir/shard-<i>``.

    ``auth_key_file`` (HMAC secret) or ``curve_dir`` (keys from ``cosparse ps keygen``) turn on
    authentication; ``client()`` then authenticates the same way. ``max_rows``: each shard's row
    budget (``ps serve --max-rows``), ``max_bytes`` its byte budget (``--max-bytes``). ``tables``
    are registered in ``namespace``, with ``quota`` (``{rows, bytes}`` per shard), and
    ``client()`` works in that namespace.
    ``threads``: each shard's numba and OpenMP threads, and its ``--shard-threads`` (the run's CPU
    budget counts a core per embedded shard; each row's update runs on one thread whatever the
    count, so results do not depend on it).
    """

    def __init__(
        self,
        num_shards: int,
        tables: list[TableConfig] | None = None,
        data_dir: str | Path = "ps-data",
        config: str | Path | None = None,
        auth_key_file: str | Path | None = None,
        curve_dir: str | Path | None = None,
        start_timeout_s: float = 60.0,
        extra_args: list[str] | None = None,
        restore: list[str] | None = None,
        max_rows: int | None = None,
        max_bytes: int | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        quota: dict | None = None,
        threads: int = 1,
    ) -> None:
        if num_shards < 1:
            raise ValueError("num_shards must be >= 1")
        self.num_shards = num_shards
        self.data_dir = Path(data_dir)
        self.auth_key_file = auth_key_file
        self.curve_dir = Path(curve_dir) if curve_dir is not None else None
        self.restore = restore  # per shard: the snapshot to start from (a trainer checkpoint's)
        self.max_rows = max_rows  # each shard's row budget (ps serve --max-rows; None: its default)
        self.max_bytes = max_bytes  # and byte budget (ps serve --max-bytes; None: its default)
        self.namespace, self.quota = namespace, quota  # of ``tables`` and of ``client()``
        self.env = {**os.environ, "NUMBA_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
        self.threads = threads
        self.procs: list[subprocess.Popen] = []
        self.endpoints: list[str] = []
        self._closed = False
        _LIVE.add(self)
        try:
            self._start(config, start_timeout_s, extra_args or [])
            if tables:
                with self.client() as c:
                    c.register(tables)
        except BaseException:
            self.close()
            raise

    def _start(self, config: str | Path | None, timeout_s: float, extra: list[str]) -> None:
        ready = []
        for i in range(self.num_shards):
            d = self.data_dir / f"shard-{i}"
            d.mkdir(parents=True, exist_ok=True)
            rf = d / "endpoint"
            rf.unlink(missing_ok=True)
            cmd = [sys.executable, "-m", "cosparse.cli", "ps", "serve", "--shard", str(i),
                   "--num-shards", str(self.num_shards), "--bind", "127.0.0.1:0",
                   "--data-dir", str(d), "--ready-file", str(rf), "--parent-pid", str(os.getpid())]
            if config is not None:
                cmd += ["--config", str(config)]
            if self.auth_key_file is not None:
                cmd += ["--auth-key", str(self.auth_key_file)]
            if self.curve_dir is not None:
                cmd += ["--curve-secret", str(self.curve_dir / "server.key_secret")]
            if self.restore is not None:
                cmd += ["--restore", self.restore[i]]
            if self.max_rows is not None:
                cmd += ["--max-rows", str(self.max_rows)]
            if self.max_bytes is not None:
                cmd += ["--max-bytes", str(self.max_bytes)]
            if self.threads > 1:
                cmd += ["--shard-threads", str(self.threads)]
            log = open(d / "server.log", "ab")  # noqa: SIM115 - closed after Popen took it
            try:
                self.procs.append(subprocess.Popen(cmd + extra, stdin=subprocess.DEVNULL, stdout=log,
                                                   stderr=log, preexec_fn=pdeathsig(), env=self.env))
            finally:
                log.close()
            ready.append(rf)
        deadline = time.monotonic() + timeout_s
        for i, rf in enumerate(ready):
            while not rf.exists():
                rc = self.procs[i].poll()
                if rc is not None:
                    raise PSUnavailable(i, "(not started)", f"process exited with code {rc} during "
                                                            f"start-up: {self._log_tail(i)}")
                if time.monotonic() > deadline:
                    raise PSUnavailable(i, "(not started)", f"no endpoint after {timeout_s:g} s")
                time.sleep(0.02)
            self.endpoints.append(rf.read_text().strip())
        with self.client(timeout_s=max(1.0, deadline - time.monotonic())) as c:
            c.ping()

    def _log_tail(self, i: int) -> str:
        try:
            return (self.data_dir / f"shard-{i}" / "server.log").read_text()[-2000:].strip()
        except OSError:
            return ""

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def client(self, timeout_s: float = 30.0, heartbeat_s: float = 1.0,
               link: LinkShaper | None = None) -> PSClient:
        """A client of these shards, with this process watch attached (``link``: a simulated
        link its traffic crosses)."""
        curve = None
        if self.curve_dir is not None:
            curve = (self.curve_dir / "clients" / "client.key_secret", self.curve_dir / "server.key")
        return PSClient(self.endpoints, timeout_s=timeout_s, heartbeat_s=heartbeat_s,
                        auth_key=self.auth_key_file, curve=curve, watch=self.check, link=link,
                        namespace=self.namespace, quota=self.quota)

    def check(self) -> None:
        """Process watch: raise ``PSUnavailable`` for the first embedded shard that has exited."""
        for i, p in enumerate(self.procs):
            rc = p.poll()
            if rc is not None and not self._closed:
                ep = self.endpoints[i] if i < len(self.endpoints) else "(not started)"
                raise PSUnavailable(i, ep, f"embedded shard process {p.pid} exited with code {rc}")

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop every shard (SIGTERM, then SIGKILL after ``timeout_s``) and reap it. A stopped
        shard (SIGSTOP) cannot act on SIGTERM: it gets SIGKILL at once."""
        self._closed = True
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.kill() if _stopped(p.pid) else p.terminate()
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout_s
        for p in self.procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        _LIVE.discard(self)

    def __enter__(self) -> EmbeddedShards:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()
