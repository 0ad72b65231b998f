"""Smoke test of benchmarks/bench_inmemory.py (``python -m benchmarks.bench_inmemory``): a --tiny
run (2 tables x 10k rows, batch 256, 2 rounds x 3 steps) of every contender, the trainer's
(builtin, api) included, in a subprocess, checking the JSON it writes. Takes ~20 s on 2 cores.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import bench_inmemory, bench_tiers
from benchmarks.bench_inmemory import IN_PROCESS
from benchmarks.trainer_contenders import paired_api

REPO = Path(__file__).resolve().parents[1]
BENCH = ["-m", "benchmarks.bench_inmemory"]  # run from the repository root


def test_bench_inmemory_tiny(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, *BENCH, "--quick", "--tiny", "--threads", "2", "--json", str(out),
         "--contenders", ",".join(IN_PROCESS)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    for key in ("cosparse_samples_per_s", "cosparse_inline_samples_per_s", "torch_samples_per_s",
                "ratio", "embedding_ratio"):
        assert res[key] > 0, key
    assert set(res["embedding_ms"]) >= {"cosparse", "torch"}
    assert all(v > 0 for v in res["embedding_ms"].values())
    assert set(res["peak_rss_mb"]) == {"cosparse", "cosparse_inline", "cosparse_fixed", "torch",
                                       "dense_bound", "builtin", "api"}
    # the fixed vocabulary trains the dynamic one's numbers (the same batches, the same seed)
    fixed = res["contenders"]["cosparse_fixed"]
    assert fixed["loss_last"] == res["contenders"]["cosparse"]["loss_last"]
    assert fixed["embedding_ms"] > 0 and res["ratio_paired_cosparse_fixed_vs_cosparse"] > 0
    assert res["dense_bound_samples_per_s"] > 0 and res["contenders"]["dense_bound"]["embedding_ms"] is None
    assert res["over_dense_bound"] == round(
        res["cosparse_samples_per_s"] / res["dense_bound_samples_per_s"], 3)
    t = res["targets"]["over_dense_bound_paired"]
    assert t["value"] == res["over_dense_bound_paired"] > 0 and t["target"] == 0.75 and t["stretch"] == 0.9
    assert t["pass"] == (t["value"] >= 0.75)
    assert "TARGET over_dense_bound_paired >= 0.75 (stretch 0.9): " in proc.stdout
    assert all(v > 0 for v in res["peak_rss_mb"].values())
    for name, c in res["contenders"].items():
        assert c["step_ms_p50"] > 0, name
        assert len(c["rounds_samples_per_s"]) == res["config"]["rounds"] == 2
    assert res["config"]["tables"] == 2 and res["config"]["batch"] == 256
    assert res["machine"]["nproc"] >= 1 and len(res["machine"]["loadavg"]) == 3
    assert res["cosparse_breakdown_ms"]["total"] > 0
    assert "ratio = " in proc.stdout and "embedding_ratio = " in proc.stdout
    # the trainer with model.kind dlrm against the public API's DLRM: the same losses every round
    api, builtin = res["contenders"]["api"], res["contenders"]["builtin"]
    assert api["info"]["trainer"] == "cosparse.api.trainer.Trainer"
    assert builtin["info"]["trainer"] == "cosparse.train.trainer.Trainer"
    assert res["api_builtin_same_losses"] and res["api_builtin_final_loss"] > 0
    assert api["loss_last"] == builtin["loss_last"] == round(res["api_builtin_final_loss"], 4)
    assert res["api_over_builtin"] > 0 and len(res["api_over_builtin_spread"]["rounds"]) == 2
    assert res["api_over_builtin_step_p50"] > 0 and res["api_over_builtin_run"] > 0
    assert {"forward", "backward", "optim"} <= set(res["api_minus_builtin_stages_ms"])
    assert "api_over_builtin = " in proc.stdout
    assert res["machine"]["cpu"] and res["machine"]["cpu_flags"] not in ("", "?")


def test_api_pair_refuses_different_losses() -> None:
    """``api_over_builtin`` is only reported for runs that trained the same numbers."""
    rounds = {"rounds_samples_per_s": [10.0, 12.0], "run_s": [1.0, 1.0], "step_s": [0.1, 0.2]}
    same = paired_api({"api": {**rounds, "losses": [0.7, 0.6]},
                       "builtin": {**rounds, "losses": [0.7, 0.6]}})
    assert same["api_over_builtin"] == same["api_over_builtin_step_p50"] == 1.0
    assert same["api_builtin_final_loss"] == 0.6
    with pytest.raises(RuntimeError, match="different numbers"):
        paired_api({"api": {**rounds, "losses": [0.7, 0.6]},
                    "builtin": {**rounds, "losses": [0.7, 0.6000001]}})


def test_peer_missing_venv_fails_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """(In this process: ``main`` refuses before it starts any worker; the module's command line
    itself is run by test_bench_inmemory_tiny.)"""
    with pytest.raises(SystemExit) as e:
        bench_inmemory.main(["--tiny", "--peer", "torchrec",
                             "--peer-python", str(tmp_path / "nope" / "python")])
    assert e.value.code == 2
    assert "make peers" in capsys.readouterr().err


def test_device_cuda_refusals() -> None:
    """--device cuda: the CPU-only torch contender is refused; without a CUDA device, so is the run
    (in this process, as above: each refusal comes before any worker starts)."""
    with pytest.raises(SystemExit, match="--contenders cosparse,cosparse_inline,dense_bound"):
        bench_inmemory.main(["--tiny", "--device", "cuda"])
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="--device cuda: torch .* sees no CUDA device"):
            bench_inmemory.main(["--tiny", "--device", "cuda", "--contenders", "cosparse,dense_bound"])
        with pytest.raises(SystemExit, match="sees no CUDA device"):
            bench_tiers.main(["--tiny", "--device", "cuda"])


def test_bench_contention_tiny(tmp_path: Path) -> None:
    """bench_contention --tiny: the resident workload alone and beside one busy loop, whose
    process is gone afterwards."""
    out = tmp_path / "contention.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_contention", "--tiny", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    w = res["workloads"]["resident"]
    assert w["u_cores"] > 0 and w["alone_samples_per_s"] > 0 and w["waits_per_step"] >= 0
    k1 = w["per_k"]["1"]
    assert k1["slowdown"] > 0 and k1["predicted"] >= 1
    assert abs(k1["slowdown_over_fair_share"] - k1["slowdown"] / k1["predicted"]) < 0.01
    assert res["worst_slowdown_over_fair_share"] == k1["slowdown_over_fair_share"]
    assert [c["k"] for c in res["calls"]["resident"]] == [0, 1]
    assert all(c["sync"] is not None and c["cpu"]["wait_policy"] == "PASSIVE"
               for c in res["calls"]["resident"])
    assert len(res["busy_loop_pids"]) == 1
    for pid in res["busy_loop_pids"]:  # stopped and reaped
        assert not Path(f"/proc/{pid}").exists(), f"busy loop {pid} outlived the benchmark"
