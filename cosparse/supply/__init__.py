"""Parameter-supply paths: how rows reach the trainer (``ps-direct``: architecture A)."""
