"""The PS fuzz suites' target (``test_ps_fuzz.py``, ``test_ps_fuzz_state.py``): a real
`cosparse ps serve` process with a small message limit, a raw fuzzing connection to it and a
legitimate client, plain or with an HMAC key; and hypothesis settings that keep each suite
bounded (``COSPARSE_FUZZ_SCALE=10`` runs ten times the examples)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings
from ps_raw import RawPeer

from cosparse.config import OptimizerConfig, TableConfig
from cosparse.ps import EmbeddedShards
from cosparse.ps import protocol as P

SCALE = float(os.environ.get("COSPARSE_FUZZ_SCALE", "1"))
MAX_MESSAGE = P.MIN_MESSAGE_LIMIT  # the shard's --max-message-bytes: oversized cases stay cheap
CHECK_EVERY = 25  # cases between two checks with a legitimate client
TABLES = [TableConfig("sgd", dim=8, optimizer=OptimizerConfig(kind="sgd", lr=0.1), seed=1),
          TableConfig("adam", dim=4, optimizer=OptimizerConfig(kind="adam", lr=0.01), seed=3),
          # (no name that a truncated "adam" or "sgd" would spell: those cases must stay errors)
          TableConfig("agrad", dim=4, optimizer=OptimizerConfig(kind="adagrad", lr=0.1), seed=4),
          TableConfig("rwa", dim=8, optimizer=OptimizerConfig(kind="rowwise_adagrad", lr=0.1),
                      seed=5),
          TableConfig("probe", dim=4, seed=9)]  # never named by the fuzzer: must stay unchanged
PROBE_IDS = np.arange(-20, 20, dtype=np.int64)


def _settings(examples: int) -> settings:
    # no shrinking: after a shard dies every case fails alike, and each would wait for its reply
    return settings(max_examples=max(1, int(examples * SCALE)), deadline=None, database=None,
                    derandomize=True, suppress_health_check=list(HealthCheck),
                    phases=[Phase.explicit, Phase.reuse, Phase.generate])


class Target:
    """A shard process, a raw fuzzing connection to it, and a legitimate client."""

    def __init__(self, tmp, key_file) -> None:
        self.key = key_file.read_bytes().strip() if key_file is not None else None
        self.sh = EmbeddedShards(1, TABLES, tmp, auth_key_file=key_file,
                                 extra_args=["--max-message-bytes", str(MAX_MESSAGE)])
        self.client = self.sh.client(timeout_s=20)
        self.probe = self.client.pull("probe", PROBE_IDS, with_state=True)
        self.raw = RawPeer(self.sh.endpoints[0], key=self.key, timeout_s=5)
        self.cases = 0

    def check(self) -> None:
        """The shard process is alive and a legitimate client gets the same probe rows."""
        assert self.sh.procs[0].poll() is None, "the shard process exited"
        got = self.client.pull("probe", PROBE_IDS, with_state=True)
        assert np.array_equal(got.rows, self.probe.rows)
        assert np.array_equal(got.versions, self.probe.versions)

    def answer(self, frames: list[bytes], expect_error: bool = True) -> P.Message:
        """Send one case; its reply (every case must get one)."""
        frames = self.raw.authenticate(frames)
        head = P.peek_header(frames)
        self.raw.send(frames)
        rep = self.raw.recv()
        if rep is None:
            rc = self.sh.procs[0].poll()
            state = "running" if rc is None else f"exited with code {rc}: {self.sh._log_tail(0)}"
            pytest.fail(f"no reply within 5 s to {[f[:64] for f in frames]} (shard {state})")
        assert rep.flags & P.FLAG_REPLY
        assert rep.request_id == (head[2] if head is not None else 0)
        if expect_error:
            assert rep.error != P.E_OK, (rep, [f[:64] for f in frames])
        if rep.error != P.E_OK:
            assert rep.error in P.ERROR_NAMES and rep.text, rep
        self.cases += 1
        if self.cases % CHECK_EVERY == 0:
            self.check()
        return rep

    def close(self) -> None:
        try:
            self.raw.close()
            self.client.close()
        finally:
            self.sh.close()


def serve_target(param: str, tmp_path_factory) -> Iterator[Target]:
    """The body of a module-scoped ``target`` fixture: ``param`` is "plain" or "hmac"."""
    tmp = tmp_path_factory.mktemp(f"fuzz-{param}")
    key_file = None
    if param == "hmac":
        key_file = tmp / "hmac.key"
        key_file.write_bytes(os.urandom(32).hex().encode())
    t = Target(tmp / "ps", key_file)
    try:
        yield t
    finally:
        t.close()
    assert all(p.poll() is not None for p in t.sh.procs)



def _run(capsys, target: Target, name: str, body) -> None:
    t0, before = time.perf_counter(), target.cases
    try:
        body()
        target.check()
    finally:
        with capsys.disabled():
            print(f"\n[fuzz] ps {name} ({'hmac' if target.key else 'plain'}): "
                  f"{target.cases - before} cases in {time.perf_counter() - t0:.1f} s")
