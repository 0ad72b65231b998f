"""Sparse optimizers: one family of batched row-update kernels (numba on CPU, torch on CUDA)."""

from cosparse.optim.sparse import NonFiniteUpdate, SparseOptimizer, state_width

__all__ = ["NonFiniteUpdate", "SparseOptimizer", "state_width"]
