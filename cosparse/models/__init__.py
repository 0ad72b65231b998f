"""The built-in models rebuilt on the public API (``cosparse.EmbeddingBagCollection``,
``cosparse.Batch``), each a ``model.factory``: ``cosparse.models.dlrm:build``."""
