"""Sparse optimizers: one family of batched row-update kernels (numba on CPU, torch on CUDA)."""

from cosparse.optim.sparse import SparseOptimizer, state_width

__all__ = ["SparseOptimizer", "state_width"]
