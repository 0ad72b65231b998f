"""The embedding collection, the modules a model on the public API is built of
(``EmbeddingBagCollection``, ``Batch``, and ``EngineModel``, the trainer's side of a model), and
the dense layers of the zoo (``towers``, ``heads``, ``din``), whose models are ``cosparse.models``."""
