"""Whose rows the PS shards hold (issue 32, items 1 and 2): no run trains on another run's rows.

- Every run has an ID (``new_run_id``), made at a fresh start and kept across resumes: the
  trainer names it in each PS snapshot (``cosparse.ps.run_ids``) and its checkpoints record it
  (``meta["ps"]["run_id"]``). ``check_run`` refuses (``SnapshotMismatch``, a checkpoint error)
  shards whose restored rows belong to another run, naming both run IDs and both paths.
- External shards (``cosparse ps serve``) restore their newest snapshot when they start: a run
  that starts at step 0 against shards that hold rows of its namespace is refused
  (``held_rows`` / ``stale_rows_error``), unless it resumes or says ``--fresh``, which drops its
  own namespace's tables there with a CLEAR request (``clear_external``): other namespaces'
  tables on the same shards stay.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cosparse.config import Config, ConfigError
from cosparse.ps import PSClient
from cosparse.ps.discovery import discover, store_address_from_env
from cosparse.ps.snapshots import StaleSnapshots
from cosparse.supply.types import SnapshotMismatch


def new_run_id() -> str:
    """A fresh run's ID: its start time (UTC) and 8 random hex digits."""
    return f"run-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(4)}"


def external_endpoints(cfg: Config) -> list[str]:
    """The endpoints of the external shards ``store.remote`` names (listed, or discovered)."""
    remote = cfg.store.remote
    if remote.discovery != "tcpstore":
        return list(remote.endpoints)
    address = remote.tcpstore or store_address_from_env()
    if address is None:
        raise ConfigError("store.remote.tcpstore: not set and MASTER_ADDR/MASTER_PORT are not "
                          "in the environment (not torchrun)")
    return discover(address, remote.num_shards, remote.timeout_s)


def held_rows(client: PSClient) -> dict[int, tuple[int, str | None]]:
    """Per shard that holds rows of the client's namespace: (rows, the run they belong to)."""
    ns, out = client.namespace, {}
    for i, st in enumerate(client.stats()):
        rows = sum(int(t.get("rows", 0)) for t in st.get("tables", {}).values()
                   if t.get("namespace") == ns)
        if rows:
            out[i] = (rows, (st.get("run_ids") or {}).get(ns))
    return out


def stale_rows_error(cfg: Config, endpoints: list[str],
                     held: dict[int, tuple[int, str | None]]) -> StaleSnapshots:
    """The refusal of a run that would start at step 0 on external shards that hold ``held``."""
    ns = cfg.store.remote.namespace_name
    where = "; ".join(f"shard {i} at {endpoints[i]}: {rows} rows"
                      + (f" of run {run}" if run else "") for i, (rows, run) in sorted(held.items()))
    ck = cfg.train.checkpoint.dir
    resume = f"--resume {ck}" if ck and (Path(ck) / "LATEST").exists() else "--resume CHECKPOINT_DIR"
    return StaleSnapshots(
        f"the external PS shards (store.remote.endpoints) hold rows of namespace '{ns}' "
        f"(store.remote.namespace) from an earlier run ({where}), restored from their "
        "snapshots; this run does not resume that run, and would train on those rows. "
        f"Go on with that run: `cosparse train {resume}` (its shards restarted with `cosparse ps "
        "serve ... --restore SNAPSHOT`); or start over: `cosparse train --fresh` (drops the tables "
        f"of namespace '{ns}' on those shards; other namespaces' stay)")


def clear_external(cfg: Config, log: Callable[[str], None]) -> None:
    """``--fresh`` against external shards: drop this run's namespace's tables on every shard
    (a CLEAR request, authenticated like every other); say what was dropped."""
    remote = cfg.store.remote
    endpoints = external_endpoints(cfg)
    with PSClient(endpoints, remote.timeout_s, remote.heartbeat_s, auth_key=remote.auth_key,
                  namespace=remote.namespace_name) as client:
        dropped = client.clear()
    rows = sum(int(d.get("rows", 0)) for d in dropped)
    tables = sorted({t for d in dropped for t in d.get("tables", [])})
    if tables:
        log(f"--fresh: dropped {rows} rows of namespace '{remote.namespace_name}' "
            f"({', '.join(tables)}) on {len(endpoints)} external PS shards")


def check_run(client: PSClient, meta: dict[str, Any], data_dir: Path | None) -> None:
    """Refuse shards restored to ``meta``'s snapshots whose rows of the client's namespace
    belong to another run than the checkpoint's (``meta["run_id"]``; checkpoints and snapshots
    written before run IDs are not checked). ``data_dir``: the embedded shards' data dir."""
    want = meta.get("run_id")
    if not want:
        return
    ns = client.namespace
    for i, st in enumerate(client.stats()):
        have = (st.get("run_ids") or {}).get(ns)
        if have and have != want:
            snap = meta["snapshots"][i]
            where = (f"store.remote.data_dir {data_dir / f'shard-{i}' / 'snapshots' / snap}"
                     if data_dir is not None else
                     f"the snapshot {snap} of PS shard {i} at {client.endpoints[i]}")
            ck = meta.get("checkpoint") or "the checkpoint"
            fix = (f"set store.remote.data_dir to run {want}'s" if data_dir is not None else
                   f"restart the shards on run {want}'s data dir (`cosparse ps serve --data-dir "
                   f"DIR --restore {snap}`)")
            raise SnapshotMismatch(
                f"checkpoint {ck} belongs to run {want}, but {where} holds the rows of "
                f"namespace '{ns}' of run {have}: the snapshot names match, the runs do not "
                "(each data dir numbers its snapshots alike); refused, nothing was trained. "
                f"To resume, {fix}; or start over with `cosparse train --fresh`")
