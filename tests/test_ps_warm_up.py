"""A shard compiles its kernels before it is ready, once per version of the sources
(``cosparse.ps.warm_up``): the cache folder's mark says a warm-up has run."""

from __future__ import annotations

from cosparse.ps.warm_up import MARK, ensure_warm, warm_up_kernels


def test_the_warm_up_runs_once_per_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    took = ensure_warm()
    assert took is not None and took >= 0 and (tmp_path / MARK).exists()
    assert ensure_warm() is None  # marked: the next shard starts without it
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    assert ensure_warm() is None  # no cache folder of ours: nothing to mark


def test_the_warm_up_runs_every_table_operation_of_every_optimizer():
    assert warm_up_kernels() < 30.0  # compiled in this process already: quick
