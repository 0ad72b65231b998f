"""Embedding collection modules and the model zoo (DLRM, DeepFM, DCN-v2, DIN)."""
