"""cosparse: sparse embedding training engine."""
