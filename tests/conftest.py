"""Before any test module imports torch: OpenMP's passive wait policy (``cosparse.omp_wait``).

libgomp reads ``OMP_WAIT_POLICY`` once, when torch or numba first loads it. Test modules import
torch before cosparse (import order), so without this a bare ``pytest`` run spins its threads:
beside six busy loops the DIN exactness test took 525 s instead of 13 s alone.
"""

import cosparse.omp_wait  # noqa: F401  (sets the policy; must come before torch)
