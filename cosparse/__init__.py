"""cosparse: sparse embedding training engine.

Importing it first sets OpenMP's passive wait policy for this process and its children, unless
the environment sets one (``cosparse.omp_wait``): it must happen before torch loads.
"""

from cosparse import omp_wait  # noqa: F401  (first: before anything imports torch)
