"""The public Python API: a model of the user's own on every placement, path and rank count.

``load_config`` (``config``), ``EmbeddingBagCollection`` (``embedding_bags``), ``Batch``
(``batch``), ``Trainer`` and ``RunResult`` (``trainer``); the engine's side of a user's model in
``engine_model`` and ``lazy``. ``cosparse`` re-exports them lazily (importing it loads no torch).
"""
