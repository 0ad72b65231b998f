"""PSConnection: the PS shards a supply path uses, and everything about them.

It starts embedded ``cosparse ps serve`` processes (in ``store.remote.data_dir``, or a temporary
directory removed at close) or reaches external shards (listed, or found through a TCPStore),
and holds the client. It takes the shards' snapshots for a checkpoint, prunes the ones no
checkpoint names, restarts embedded shards from a checkpoint's snapshots (or checks that
external ones were), refuses to start a fresh run on an earlier run's snapshots (embedded) or
rows (external shards, which restore their newest snapshot), refuses to resume from another
run's snapshots (``run_id``: ``ps_ownership``), and counts every byte on the trainer's sockets
across restarts.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path
from typing import Any

from cosparse.config import Config
from cosparse.owner import owner_tag
from cosparse.ps import EmbeddedShards, PSClient, snapshots
from cosparse.supply.leftovers import earlier_snapshots, stale_snapshots_error
from cosparse.supply.ps_ownership import (
    check_run,
    external_endpoints,
    held_rows,
    new_run_id,
    stale_rows_error,
)
from cosparse.supply.types import PathContext, SnapshotMismatch

_COUNTED = ("bytes_pull", "bytes_push", "requests", "wait_s")


class PSConnection:
    """The shards of one run and the trainer's client to them."""

    def __init__(self, cfg: Config, ctx: PathContext) -> None:
        self.cfg, self.ctx = cfg, ctx
        self.shards: EmbeddedShards | None = None
        self.client: PSClient | None = None
        self._tmp: str | None = None
        self.earlier: dict[str, str] = {}  # an earlier run's snapshots: refused unless resumed
        # external shards: rows of this namespace they held when reached (refused unless resumed)
        self.held: dict[int, tuple[int, str | None]] = {}
        self.run_id = new_run_id()  # this run's: named in its snapshots, kept across resumes
        self._base = dict.fromkeys(_COUNTED, 0.0)  # counters of clients a restore replaced

    def start(self, restore: list[str] | None = None) -> None:
        """Start the embedded shards (from the snapshots ``restore`` names) or reach external
        ones; on failure everything started is stopped again."""
        remote = self.cfg.store.remote
        try:
            if remote.embedded:
                data_dir = remote.data_dir
                if data_dir is None:
                    if self._tmp is None:
                        self._tmp = tempfile.mkdtemp(prefix=f"cosparse-ps-{owner_tag()}-")
                    data_dir = self._tmp
                if restore is None:
                    self.earlier = earlier_snapshots(self.cfg)
                self.shards = EmbeddedShards(remote.num_shards, self.cfg.tables, data_dir,
                                             auth_key_file=remote.auth_key, restore=restore,
                                             max_rows=remote.max_rows,
                                             max_bytes=remote.max_bytes,
                                             namespace=remote.namespace_name, quota=self.quota)
                self.client = self.shards.client(remote.timeout_s, remote.heartbeat_s,
                                                 self.ctx.links.trainer_ps)
                return
            endpoints = external_endpoints(self.cfg)
            self.client = PSClient(endpoints, remote.timeout_s, remote.heartbeat_s,
                                   auth_key=remote.auth_key, link=self.ctx.links.trainer_ps,
                                   namespace=remote.namespace_name, quota=self.quota)
            self.client.register(self.cfg.tables)
            self.held = held_rows(self.client)
        except BaseException:
            self.close()
            raise

    @property
    def quota(self) -> dict | None:
        """This run's namespace quota as the shards take it (``store.remote.quota``)."""
        q = self.cfg.store.remote.quota
        return None if q is None else {"rows": q.rows, "bytes": q.bytes}

    def describe(self, role: str) -> str:
        assert self.client is not None
        remote = self.cfg.store.remote
        where = (f"{remote.num_shards} embedded shards" if remote.embedded
                 else f"{self.client.num_shards} shards")
        return f"{role}: {where} at {', '.join(self.client.endpoints)}"

    # --- checkpoints ----------------------------------------------------------------------
    @property
    def durable(self) -> bool:
        """The shards keep their snapshots where a later run finds them (not a temporary dir)."""
        remote = self.cfg.store.remote
        return self.client is not None and (not remote.embedded or remote.data_dir is not None)

    def refuse_stale(self) -> None:
        if self.earlier:  # not resumed from them: this run would train on old rows
            raise stale_snapshots_error(self.cfg, self.earlier)
        if self.held:
            assert self.client is not None
            raise stale_rows_error(self.cfg, self.client.endpoints, self.held)

    def snapshot(self, full: bool) -> dict[str, Any]:
        """Every shard snapshots its rows (incremental unless ``full``, when the config asks for
        incremental ones); returns what the checkpoint records."""
        assert self.client is not None
        incremental = self.cfg.train.checkpoint.incremental and not full
        names = self.client.snapshot(incremental=incremental, run_id=self.run_id)
        n = self.client.num_shards
        return {"num_shards": n, "snapshots": [names[i] for i in range(n)], "run_id": self.run_id}

    def prune(self, metas: list[dict[str, Any]]) -> None:
        """Keep the snapshots that ``metas`` (the checkpoints on disk) name, each with the chain
        it needs, and the shards' newest; remove the others. Embedded shards only."""
        if self.shards is None or not self.durable:
            return
        keep: list[set[str]] = [set() for _ in range(self.shards.num_shards)]
        for meta in metas:
            for i, name in enumerate((meta.get("snapshots") or [])[: len(keep)]):
                keep[i].add(name)
        for i, names in enumerate(keep):
            snapshots.prune(self.shards.data_dir / f"shard-{i}", names)

    def restore(self, meta: dict[str, Any], endpoints: list[str] | None = None) -> bool:
        """Bring the PS to the snapshots ``meta`` names: restart embedded shards from them
        (True: the client is new), or check that external shards were restarted from them; either
        way their rows must be of ``meta``'s run (``check_run``; ``meta["checkpoint"]``: its
        path, for the message), whose ID this run goes on with. ``endpoints``: another process
        restarted them there (rank 0 of many ranks): reach them and check (True)."""
        if endpoints is not None:
            self._reach(endpoints)
        remote, names = self.cfg.store.remote, meta["snapshots"]
        assert self.client is not None
        have = remote.num_shards if remote.embedded else self.client.num_shards
        if len(names) != have:
            raise SnapshotMismatch(f"checkpoint was taken with {len(names)} PS shards, the "
                                   "config has a different number (store.remote)")
        if not remote.embedded:
            for i, st in enumerate(self.client.stats()):
                if st.get("last_snapshot") != names[i]:
                    raise SnapshotMismatch(
                        f"PS shard {i} at {self.client.endpoints[i]} holds snapshot "
                        f"{st.get('last_snapshot')!r}; this checkpoint needs {names[i]!r}: "
                        f"restart it with `cosparse ps serve ... --restore {names[i]}`")
            check_run(self.client, meta, None)
            self._go_on(meta)
            return endpoints is not None
        self.earlier = {}  # the run they belong to goes on
        self._stop_shards()
        self.start(restore=names)
        assert self.client is not None
        check_run(self.client, meta, self.data_dir)
        self._go_on(meta)
        return True

    def _go_on(self, meta: dict[str, Any]) -> None:
        """The checkpoint's run goes on: its rows are this run's, and so is its ID."""
        self.held = {}
        self.run_id = meta.get("run_id") or self.run_id

    def _reach(self, endpoints: list[str]) -> None:
        """Stop what this connection started, and reach the shards at ``endpoints``."""
        remote = dataclasses.replace(self.cfg.store.remote, embedded=False, data_dir=None,
                                     endpoints=list(endpoints), discovery="config")
        self.cfg = dataclasses.replace(self.cfg, store=dataclasses.replace(self.cfg.store,
                                                                         remote=remote))
        self._stop_shards()
        self.start()

    # --- metrics and lifetime -------------------------------------------------------------
    def counters(self) -> dict[str, float]:
        """Bytes, requests and waits on the trainer's PS sockets since the run started."""
        c = self.client.counters if self.client is not None else None
        now = {k: self._base[k] + (getattr(c, k) if c is not None else 0) for k in _COUNTED}
        return {"bytes.trainer_ps.pull": now["bytes_pull"],
                "bytes.trainer_ps.push": now["bytes_push"],
                "ps.requests": now["requests"], "ps.wait_ms": now["wait_s"] * 1e3}

    def gauges(self) -> dict[str, float]:
        """The shards' own figures (one small request per shard)."""
        if self.client is None:
            return {}
        stats = self.client.stats()
        return {"ps.queue_depth_max": max(int(st.get("max_queue_depth", 0)) for st in stats),
                "ps.busy_s": sum(float(st.get("busy_s", 0.0)) for st in stats)}

    def _stop_shards(self) -> None:
        if self.client is not None:
            for k in _COUNTED:
                self._base[k] += getattr(self.client.counters, k)
            self.client.close()
            self.client = None
        if self.shards is not None:
            self.shards.close()
            self.shards = None

    def close(self) -> None:
        """Stop the shards this connection started and remove their temporary directory (safe
        to call twice)."""
        self._stop_shards()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    @property
    def data_dir(self) -> Path | None:
        return self.shards.data_dir if self.shards is not None else None
