"""Before any test module imports torch: OpenMP's passive wait policy (``cosparse.omp_wait``).

libgomp reads ``OMP_WAIT_POLICY`` once, when torch or numba first loads it. Test modules import
torch before cosparse (import order), so without this a bare ``pytest`` run spins its threads:
beside six busy loops the DIN exactness test took 525 s instead of 13 s alone.
"""

import pytest

import cosparse.omp_wait  # noqa: F401  (sets the policy; must come before torch)


@pytest.fixture(scope="session", autouse=True)
def _ps_kernels_compiled() -> None:
    """The PS shards that tests start find their kernels compiled: on a cold kernel cache (a
    fresh clone, or any source change) this process compiles them once, before the first test
    (``cosparse.ps.warm_up``), instead of every shard compiling them under load."""
    from cosparse.ps.warm_up import ensure_warm

    ensure_warm()
    ensure_warm(threads=2)  # (``ps serve --shard-threads 2``'s parallel kernels)
