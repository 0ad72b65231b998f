"""cosparse: sparse embedding training engine.

Importing it first sets OpenMP's passive wait policy for this process and its children, unless
the environment sets one (``cosparse.omp_wait``): it must happen before torch loads. Then it
points numba's kernel cache at a folder keyed by the sources (``cosparse.numba_cache``): before
any kernel is decorated.
"""

# (both import only the standard library, so their order does not matter: each must run before
# torch, numba or any kernel module is imported)
from cosparse import (
    numba_cache,  # noqa: F401
    omp_wait,  # noqa: F401
)
