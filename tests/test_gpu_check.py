"""benchmarks/gpu_check.sh and its wheelhouse, in the parts a machine without CUDA can check: the
script's syntax, its steps in --dry-run, its refusals, and which wheels it would install."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import wheelhouse

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_check.sh"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60)


def test_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    if shutil.which("shellcheck"):
        proc = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout


def test_dry_run_prints_every_step_within_the_limit(tmp_path: Path):
    out = tmp_path / "gpu"
    proc = _run("--dry-run", "--out", str(out), "--time-limit", "100")
    assert proc.returncode == 0, proc.stderr
    steps = [ln.split()[1] for ln in proc.stdout.splitlines() if ln.startswith("step ")]
    assert steps == ["install", "env", "cuda_tests", "bench_inmemory", "bench_tiers", "bench_ab"]
    limits = [int(ln.split("limit")[1].split("s:")[0]) for ln in proc.stdout.splitlines()
              if ln.startswith("step ")]
    assert all(0 < x <= 100 for x in limits)
    assert "--no-index --no-deps --find-links" in proc.stdout
    assert "-k cuda tests/test_embedding.py" in proc.stdout
    for bench in ("bench_inmemory", "bench_tiers"):
        line = next(ln for ln in proc.stdout.splitlines() if f"-m benchmarks.{bench} " in ln)
        assert "--quick --device cuda" in line and f"--json {out}/{bench}_quick.json" in line
    assert f"--json {out}/bench_ab_quick.json" in proc.stdout
    assert not out.exists()  # a dry run writes nothing


def test_refusals(tmp_path: Path):
    proc = _run("--bogus")
    assert proc.returncode == 2 and "unknown option '--bogus'" in proc.stderr
    proc = _run("--time-limit", "5m")
    assert proc.returncode == 2 and "--time-limit: '5m' is not a whole number" in proc.stderr
    proc = _run("--time-limit", "30")
    assert proc.returncode == 2 and "60 at least" in proc.stderr
    if not torch.cuda.is_available():  # a real run here stops before it creates anything
        out = tmp_path / "gpu"
        proc = _run("--python", sys.executable, "--out", str(out), "--venv", str(tmp_path / "v"))
        assert proc.returncode == 2 and "sees no CUDA device" in proc.stderr
        assert not out.exists() and not (tmp_path / "v").exists()


def test_wheelhouse_requirements_are_the_projects_without_torch():
    reqs = wheelhouse.requirements()
    names = {wheelhouse.requirement_name(r) for r in reqs}
    assert "torch" not in names
    assert {"numpy", "numba", "pyzmq", "pytest", "pytest-timeout"} <= names
    assert any(r.startswith("numpy>=") for r in reqs)  # the range; `make wheelhouse` adds constraints.txt


def _wheel(d: Path, name: str, version: str) -> Path:
    p = d / f"{name}-{version}-py3-none-any.whl"
    p.write_bytes(b"")
    return p


def test_missing_wheels(tmp_path: Path):
    have = importlib.metadata.version("numpy")
    same = _wheel(tmp_path, "numpy", have)
    _wheel(tmp_path, "PyYAML", "0.0.1")  # installed at another version: kept, with a note
    absent = _wheel(tmp_path, "cosparse_no_such_dist", "1.0")
    _wheel(tmp_path, "torch", "9.9")  # never brought, never installed
    todo, notes = wheelhouse.missing(tmp_path)
    assert todo == [absent]
    assert notes == [f"pyyaml: keeping the installed {importlib.metadata.version('pyyaml')} "
                     "(wheelhouse has 0.0.1)"]
    todo, _ = wheelhouse.missing(tmp_path, all_wheels=True)
    assert set(todo) == {same, absent, tmp_path / "PyYAML-0.0.1-py3-none-any.whl"}
    with pytest.raises(SystemExit, match="make wheelhouse"):
        wheelhouse.missing(tmp_path / "nope")
    with pytest.raises(ValueError, match="not a wheel file name"):
        wheelhouse.wheel_name_version(tmp_path / "numpy.whl")
