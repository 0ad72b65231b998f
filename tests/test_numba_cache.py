"""numba's kernel cache lives in a folder keyed by a digest of cosparse's sources."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from cosparse import numba_cache

REPO = Path(__file__).resolve().parents[1]


def test_the_digest_changes_with_any_source_file(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    first = numba_cache.source_digest(pkg)
    assert numba_cache.source_digest(pkg) == first
    (pkg / "sub" / "b.py").write_text("y = 3\n")  # an inlined helper's file, say
    assert numba_cache.source_digest(pkg) != first
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    assert numba_cache.source_digest(pkg) == first
    (pkg / "c.py").write_text("")
    assert numba_cache.source_digest(pkg) != first


def _run(code: str, env: dict[str, str], *args: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_kernels_are_cached_in_the_folder_of_this_source_version(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != numba_cache.VARIABLE}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    root = tmp_path / "cosparse" / "numba"
    stale = root / "0123456789abcdef"  # another version's folder, unused for over a week
    stale.mkdir(parents=True)
    old = time.time() - numba_cache.KEEP_UNUSED_S - 60
    os.utime(stale, (old, old))
    recent = root / "fedcba9876543210"  # another version's, used yesterday: kept
    recent.mkdir()
    os.utime(recent, (time.time() - 86400,) * 2)
    code = ("import os, numpy as np, cosparse\n"
            "from cosparse.store import kernels\n"
            "ids = np.array([5, 3, 5], dtype=np.int64)\n"
            "kernels.dedup(ids, np.full(32, -1, np.int64), np.uint64(60),"
            " np.empty(3, np.int64), np.empty(3, np.int64), np.empty(3, np.int64),"
            " np.empty(3, np.int64))\n"
            "print(os.environ['NUMBA_CACHE_DIR'])\n")
    folder = Path(_run(code, env))
    digest = numba_cache.source_digest(REPO / "cosparse")
    assert folder == root / digest
    assert list(folder.rglob("*.nbi")), "the kernel's build was not cached in the folder"
    assert not stale.exists() and recent.exists()


def test_a_cache_folder_the_environment_sets_is_used_as_it_is(tmp_path: Path) -> None:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "mine"), XDG_CACHE_HOME=str(tmp_path))
    out = _run("import os, cosparse\nprint(os.environ['NUMBA_CACHE_DIR'],"
               " cosparse.numba_cache.FOLDER)", env)
    assert out == f"{tmp_path / 'mine'} None"
    assert not (tmp_path / "cosparse").exists()


def test_serial_and_parallel_variants_of_one_function_have_cache_entries_of_their_own(
        tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != numba_cache.VARIABLE}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    code = ("import sys, numpy as np, cosparse\n"
            "from cosparse.store.kernels import rows\n"
            "k = rows.init_rows if sys.argv[1] == 'parallel' else rows.init_rows_serial\n"
            "out = np.empty((4, 3), np.float32)\n"
            "k(out, np.arange(4), np.arange(4), 7, 2, 0, -0.1, 0.1, 0.0, 0)\n"
            "print(sum(k.stats.cache_hits.values()), sum(k.stats.cache_misses.values()))\n")
    assert _run(code, env, "parallel") == "0 1"
    assert _run(code, env, "serial") == "0 1"  # not the parallel build
    assert _run(code, env, "serial") == "1 0"
    assert _run(code, env, "parallel") == "1 0"
