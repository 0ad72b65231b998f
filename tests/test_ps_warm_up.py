"""A shard compiles its kernels before it is ready, once per version of the sources
(``cosparse.ps.warm_up``): the cache folder's mark says a warm-up has run."""

from __future__ import annotations

from cosparse.ps.warm_up import MARK, ensure_warm, mark_of, warm_up_kernels


def test_the_warm_up_runs_once_per_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    took = ensure_warm()
    assert took is not None and took >= 0 and (tmp_path / MARK).exists()
    assert ensure_warm() is None  # marked: the next shard starts without it
    assert not (tmp_path / mark_of(2)).exists()  # a 2-thread shard's kernels are others
    assert ensure_warm(threads=2) is not None and (tmp_path / mark_of(2)).exists()
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    assert ensure_warm() is None  # no cache folder of ours: nothing to mark


def test_the_warm_up_runs_every_table_operation_of_every_optimizer():
    assert warm_up_kernels() < 30.0  # compiled in this process already: quick


def test_the_warm_up_compiles_what_requests_read_off_the_wire_take():
    """Arrays a shard reads off the wire are read-only, which numba types apart: the warm-up
    compiles both kinds, so no kernel is first compiled at a client's request (under load that
    took longer than the request timeout)."""
    from numba.core import types

    from cosparse.ps import shard_kernels as k

    warm_up_kernels()
    warm_up_kernels(threads=2)
    for kernel in (k.pull_serial, k.push_serial, k.pull_parallel, k.push_parallel):
        readonly = [sig for sig in kernel.signatures
                    if any(isinstance(t, types.Array) and not t.mutable for t in sig)]
        assert readonly, f"{kernel.__name__}: no read-only signature among {kernel.signatures}"
