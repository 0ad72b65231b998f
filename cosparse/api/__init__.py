"""The public Python API: a model of the user's own on every placement, path and rank count.

``load_config`` (``config``), ``Trainer`` and ``RunResult`` (``trainer``), ``Objective``,
``check``, models by name (``factory``), lazy modules (``lazy``). The modules a model is built
of live in ``cosparse.nn`` (``EmbeddingBagCollection``: ``embedding_bags``; ``Batch``:
``model_batch``; the engine's side of a model, ``engine_model``), below the trainer, which
trains the built-in models (``cosparse.models``) through them too. ``cosparse`` re-exports them
lazily (importing it loads no torch).
"""
