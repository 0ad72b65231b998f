"""Shard discovery through torch.distributed's TCPStore, with real shard processes."""

from __future__ import annotations

import copy
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from exactness import base_config, ps_direct

from cosparse.ps.discovery import discover
from cosparse.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_trainer_finds_announced_shards_in_the_tcpstore(tmp_path):
    from torch.distributed import TCPStore

    port = _free_port()
    master = TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=30))
    cfg = copy.deepcopy(ps_direct(base_config("zipf", "sgd"), num_shards=2, lookahead=1))
    config = tmp_path / "tables.yaml"
    config.write_text(yaml.safe_dump({"tables": [
        {"name": t.name, "dim": t.dim, "features": t.features, "pooling": t.pooling, "seed": t.seed,
         "optimizer": {"kind": t.optimizer.kind, "lr": t.optimizer.lr}} for t in cfg.tables]}))
    procs = [subprocess.Popen(
        [sys.executable, "-m", "cosparse.cli", "ps", "serve", "--shard", str(i), "--num-shards", "2",
         "--bind", "127.0.0.1:0", "--data-dir", str(tmp_path / f"ps{i}"), "--config", str(config),
         "--announce", f"127.0.0.1:{port}"], cwd=REPO, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(2)]
    try:
        endpoints = discover(f"127.0.0.1:{port}", 2, timeout_s=60)
        assert len(endpoints) == 2 and all(e.startswith("tcp://127.0.0.1:") for e in endpoints)
        cfg.store.remote.embedded = False
        cfg.store.remote.discovery = "tcpstore"
        cfg.store.remote.tcpstore = f"127.0.0.1:{port}"
        cfg.train.steps = 5
        trainer = Trainer(cfg, log=lambda m: None)
        try:
            trainer.run()
            assert trainer.path.ps.client.endpoints == endpoints
            assert trainer.state.step == 5
        finally:
            trainer.close()
        with pytest.raises(TimeoutError, match=r"shards \[0, 1, 2\] of 3"):
            discover(f"127.0.0.1:{port}", 3, timeout_s=1)  # nobody announced a 3-shard layout
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        del master
    time.sleep(0.1)
    assert all(p.poll() is not None for p in procs)
