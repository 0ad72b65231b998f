"""Trainer loop, checkpoints and metrics."""
